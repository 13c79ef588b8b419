package resulthandler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// countingStore counts the handler's Firestore operations: each MutateTask is one transaction
// (one document read and one commit), each WebhookSecrets one document read.
type countingStore struct {
	Store
	Secrets
	mutates, secretReads atomic.Int64
}

func (c *countingStore) MutateTask(ctx context.Context, id string, fn store.MutateFunc) (*protocol.Task, error) {
	c.mutates.Add(1)
	return c.Store.MutateTask(ctx, id, fn)
}

func (c *countingStore) WebhookSecrets(ctx context.Context, tenant string) ([]string, error) {
	c.secretReads.Add(1)
	return c.Secrets.WebhookSecrets(ctx, tenant)
}

// memStore is an in-memory Store, to measure the handler without Firestore.
type memStore struct {
	mu    sync.Mutex
	tasks map[string]protocol.Task
}

func (m *memStore) MutateTask(_ context.Context, id string, fn store.MutateFunc) (*protocol.Task, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tasks[id]
	if !ok {
		return nil, store.ErrNotFound
	}
	now := time.Now().UTC()
	if err := fn(&t, now); errors.Is(err, store.ErrNoChange) {
		return &t, nil
	} else if err != nil {
		return nil, err
	}
	protocol.Finalize(&t, now, store.DefaultRetention, 1)
	m.tasks[id] = t
	return &t, nil
}

// MutateTaskFrom ignores known: the map is always current, so there is nothing to save.
func (m *memStore) MutateTaskFrom(ctx context.Context, known *protocol.Task, fn store.MutateFunc) (*protocol.Task, error) {
	return m.MutateTask(ctx, known.ID, fn)
}

func (m *memStore) GetTask(_ context.Context, id string) (*protocol.Task, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tasks[id]
	if !ok {
		return nil, store.ErrNotFound
	}
	return &t, nil
}

func (m *memStore) Clock() time.Time { return time.Now().UTC() }

type staticSecrets []string

func (s staticSecrets) WebhookSecrets(context.Context, string) ([]string, error) { return s, nil }

func pendingTask(id, url string) protocol.Task {
	now := time.Now().UTC()
	tk := protocol.Task{ID: id, Tenant: tenant, Family: "summarize", Variant: "default", Input: "x",
		CallbackURL: url, State: task.StateRunning, CreatedAt: now}
	tk.Output, tk.OutputAt = strings.Repeat("generated text ", 60), &now
	tk.Finish(task.StateSucceeded, now)
	return tk
}

func benchReceiver(b *testing.B) *doubles.Receiver {
	b.Helper()
	secret, _ := webhook.NewSecret()
	return doubles.NewReceiver(b, secret)
}

func benchClient() *http.Client {
	return ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true})
}

// BenchmarkDeliveryEmulator measures whole deliveries against the Firestore emulator and a local
// receiver that verifies each signature: claim, secrets, signed POST, outcome commit.
func BenchmarkDeliveryEmulator(b *testing.B) {
	for _, par := range []int{1, 8} {
		b.Run(fmt.Sprintf("concurrency=%d", par), func(b *testing.B) {
			e := setup(b)
			e.st.Now = time.Now
			cs := &countingStore{Store: e.st, Secrets: e.st}
			h, err := New(cs, cs, e.pub, benchClient(), slog.New(slog.DiscardHandler), e.policy)
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]string, b.N)
			for i := range ids {
				ids[i] = fmt.Sprintf("bench-%d", i)
				tk := pendingTask(ids[i], e.recv.URL())
				if err := e.st.CreateTask(e.ctx, &tk); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			b.ResetTimer()
			var wg sync.WaitGroup
			for range par {
				wg.Go(func() {
					for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
						h.Handle(e.ctx, &bus.Message{Attributes: map[string]string{task.AttrTaskID: ids[i]}})
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			posts := e.recv.Hooks()
			if len(posts) != b.N {
				b.Fatalf("%d posts for %d deliveries", len(posts), b.N)
			}
			for _, p := range posts {
				if p.VerifyErr != nil {
					b.Fatal(p.VerifyErr)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
			b.ReportMetric(float64(cs.mutates.Load())/float64(b.N), "transactions/op")
			b.ReportMetric(float64(cs.secretReads.Load())/float64(b.N), "secret-reads/op")
		})
	}
}

// BenchmarkHandlerOverhead compares a delivery through the Handler on an in-memory store with
// the bare signed POST it makes: the difference is the handler's own cost per delivery.
func BenchmarkHandlerOverhead(b *testing.B) {
	b.Run("handler", func(b *testing.B) {
		r := benchReceiver(b)
		ms := &memStore{tasks: map[string]protocol.Task{}}
		ids := make([]string, b.N)
		for i := range ids {
			ids[i] = fmt.Sprintf("bench-%d", i)
			ms.tasks[ids[i]] = pendingTask(ids[i], r.URL())
		}
		h, err := New(ms, staticSecrets{r.Secret}, &testenv.Publisher{}, benchClient(), slog.New(slog.DiscardHandler), testPolicy("b"))
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ResetTimer()
		for i := range b.N {
			h.Handle(ctx, &bus.Message{Attributes: map[string]string{task.AttrTaskID: ids[i]}})
		}
		b.StopTimer()
		if n := len(r.Hooks()); n != b.N {
			b.Fatalf("%d posts", n)
		}
	})
	b.Run("bare-post", func(b *testing.B) {
		r := benchReceiver(b)
		tk := pendingTask("bench", r.URL())
		c := benchClient()
		signer, err := webhook.NewSigner(r.Secret)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			req, _ := http.NewRequest(http.MethodPost, r.URL(), strings.NewReader(tk.Delivery.Payload))
			signer.SetHeaders(req.Header, tk.Delivery.EventID, time.Now(), []byte(tk.Delivery.Payload))
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
