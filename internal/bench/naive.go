package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/worker"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// naiveWorker is the pattern genbox's outbox replaces (docs/architecture.md §4):
// per message it reads the task, generates, publishes the result with the output in the
// message, and acks. Whatever fails after the model answered — the publish, the process before
// its ack — is retried by redelivery from scratch: the output lived only in memory, so it is
// bought again. It is honest, not careless: it uses the same call policy (gemini.Client with
// its retries), skips a task already marked succeeded, and never acks work it did not finish.
type naiveWorker struct {
	store  *store.Store
	gen    worker.Generator
	render worker.Renderer
	pub    Publisher
	log    *slog.Logger
}

var _ bus.Handler = (*naiveWorker)(nil)

// naiveResult is the naive worker's result message: the output travels in it.
type naiveResult struct {
	Output string     `json:"output"`
	Model  string     `json:"model"`
	Usage  task.Usage `json:"usage"`
}

func (w *naiveWorker) Handle(ctx context.Context, m *bus.Message) bus.Result {
	id := m.Attributes[task.AttrTaskID]
	t, err := w.store.GetTask(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return bus.Ack
	case err != nil:
		return bus.Nack
	case t.State == task.StateSucceeded:
		return bus.Ack
	}
	r, err := w.render.Render(t.Family, t.Variant, t.Input, t.GenConfig)
	if err != nil {
		w.log.ErrorContext(ctx, "naive: cannot render; dropped", "task_id", id, "error", err)
		return bus.Ack
	}
	res, err := w.gen.Generate(ctx, gemini.NewRequest(t.ID, t.Tenant, r))
	if err != nil {
		return bus.Nack // retried from scratch by redelivery
	}
	data, err := json.Marshal(naiveResult{Output: res.Text, Model: res.Model, Usage: res.Usage})
	if err != nil {
		return bus.Nack
	}
	if _, err := w.pub.Publish(ctx, bus.TopicResults, data, map[string]string{task.AttrTaskID: id}); err != nil {
		return bus.Nack // the paid output is lost with this attempt
	}
	return bus.Ack
}

// naiveResults is the naive result consumer: it POSTs the signed webhook, then records the
// output; any failure is a nack and the whole message is redone.
type naiveResults struct {
	store  *store.Store
	client resulthandler.Doer
}

var _ bus.Handler = (*naiveResults)(nil)

func (c *naiveResults) Handle(ctx context.Context, m *bus.Message) bus.Result {
	id := m.Attributes[task.AttrTaskID]
	var res naiveResult
	if err := json.Unmarshal(m.Data, &res); err != nil {
		return bus.Ack
	}
	t, err := c.store.GetTask(ctx, id)
	if err != nil {
		return bus.Nack
	}
	secrets, err := c.store.WebhookSecrets(ctx, t.Tenant)
	if err != nil {
		return bus.Nack
	}
	now := time.Now().UTC()
	t.Output, t.Model, t.Usage, t.State, t.CompletedAt = res.Output, res.Model, res.Usage, task.StateSucceeded, &now
	if err := c.post(ctx, t, secrets, now); err != nil {
		return bus.Nack
	}
	if _, err := c.store.Tasks().Doc(id).Update(ctx, []firestore.Update{
		{Path: "state", Value: task.StateSucceeded}, {Path: "output", Value: res.Output}, {Path: "completed_at", Value: now},
	}); err != nil {
		return bus.Nack
	}
	return bus.Ack
}

func (c *naiveResults) post(ctx context.Context, t *protocol.Task, secrets []string, now time.Time) error {
	body, err := json.Marshal(task.Event{Type: task.EventSucceeded, Timestamp: now, Data: t.View()})
	if err != nil {
		return err
	}
	signer, err := webhook.NewSigner(secrets...)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.CallbackURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	signer.SetHeaders(req.Header, task.EventID(t.ID, task.EventSucceeded, t.Replay), now, body)
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook: %s", resp.Status)
	}
	return nil
}

// startNaive assembles the naive system on the emulators — its own counted clients, the fake
// Gemini, the naive worker and result consumer — under the same failures as genbox: its result
// publish fails and its acks are lost at the same rates, for the same tasks.
func (s *stack) startNaive(ctx context.Context, emu *emulator.Emulators, project string) error {
	if err := emu.Setenv(); err != nil {
		return err
	}
	bg := context.WithoutCancel(ctx) // the clients outlive ctx: they are needed while shutting down
	fs, err := s.counter.EmulatorClient(bg, emu.FirestoreHost, project)
	if err != nil {
		return err
	}
	s.closers = append(s.closers, func() { fs.Close() })
	s.store = store.New(fs)
	secretsKey, err := secretbox.NewLocalKey() // the naive resulthandler's too, through env
	if err != nil {
		return err
	}
	if s.store.Secrets, _, err = secretbox.FromKey(bg, secretsKey); err != nil { // a local key: nothing to close
		return err
	}
	ps, err := pubsub.NewClient(bg, project)
	if err != nil {
		return fmt.Errorf("pubsub: %w", err)
	}
	s.closers = append(s.closers, func() { ps.Close() })
	if err := bus.Bootstrap(ctx, ps, topology()); err != nil {
		return err
	}
	bp := bus.NewPublisher(ps)
	s.closers = append(s.closers, func() { bp.Close() })
	s.pub = &countingPublisher{next: bp, counts: s.pubs}
	fake := geminitest.NewServer(s.fakeOptions()...)
	s.closers = append(s.closers, fake.Close)
	s.fake = fake.Fake
	if err := s.createTenant(ctx); err != nil {
		return err
	}
	reg, err := prompts.Default()
	if err != nil {
		return err
	}
	getenv := env(emu, s.cfg.Concurrency, map[string]string{"GOOGLE_CLOUD_PROJECT": project, "GOOGLE_GEMINI_BASE_URL": fake.URL,
		secretbox.EnvKey: secretsKey})
	gcfg, err := geminienv.Config(getenv)
	if err != nil {
		return err
	}
	gen, err := gemini.New(bg, gcfg, gemini.WithLogger(s.log), gemini.WithBreakerStore(s.store))
	if err != nil {
		return err
	}
	rcfg, err := resulthandler.FromEnv(getenv)
	if err != nil {
		return err
	}

	var stopping []func()
	s.stopSystem = func(context.Context) error {
		for i := len(stopping) - 1; i >= 0; i-- {
			stopping[i]()
		}
		stopping = nil
		return nil
	}
	pull := func(subscription string, h bus.Handler) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := bus.Pull(ctx, ps, subscription, bus.PullSettings{MaxOutstandingMessages: 2 * s.cfg.Concurrency, MaxExtension: 10 * time.Minute}, h); err != nil {
				s.log.ErrorContext(ctx, "pull ended", "subscription", subscription, "error", err)
			}
		}()
		stopping = append(stopping, func() { cancel(); <-done })
	}
	wpub := &lossyPublisher{next: s.pub, in: s.in, topic: bus.TopicResults, rate: s.cfg.ResultLoss}
	w := &naiveWorker{store: s.store, gen: gen, render: reg, pub: wpub, log: s.log.With("service", "naive")}
	pull(bus.SubWorker, lostAcks(w, s.in, s.cfg.AckLoss))
	pull(bus.SubResults, &naiveResults{store: s.store, client: ssrf.NewClient(rcfg.SSRF())})
	return nil
}
