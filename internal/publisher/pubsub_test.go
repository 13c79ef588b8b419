package publisher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// emulatorBus bootstraps the topology on the Pub/Sub emulator in the project of cfg and returns
// a client and a publisher on it.
func emulatorBus(t testing.TB, project string) (*pubsub.Client, *bus.Publisher) {
	t.Helper()
	topo := bus.DefaultTopology()
	topo.AckDeadline, topo.MinBackoff, topo.MaxBackoff = 10*time.Second, 0, time.Second
	c := testenv.Bus(t, project, topo)
	p := bus.NewPublisher(c)
	t.Cleanup(func() { _ = p.Close() })
	return c, p
}

// receive pulls the worker subscription until want task ids arrived or the deadline passes.
func receive(t *testing.T, c *pubsub.Client, want ...string) map[string]map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	got := map[string]map[string]string{}
	h := bus.HandlerFunc(func(_ context.Context, m *bus.Message) bus.Result {
		mu.Lock()
		defer mu.Unlock()
		got[m.Attributes[task.AttrTaskID]] = m.Attributes
		done := true
		for _, id := range want {
			if got[id] == nil {
				done = false
			}
		}
		if done {
			cancel()
		}
		return bus.Ack
	})
	if err := bus.Pull(ctx, c, bus.SubWorker, bus.PullSettings{NumGoroutines: 1, MaxOutstandingMessages: 10}, h); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range want {
		if got[id] == nil {
			t.Fatalf("no nudge for %s on %s; got %v", id, bus.SubWorker, got)
		}
	}
	return got
}

// TestNudgeOnEmulator shows the nudge arriving on gemini-tasks through the real bus.
func TestNudgeOnEmulator(t *testing.T) {
	t.Parallel()
	var c *pubsub.Client
	e := setup(t, func(cfg *Config, d *Deps) {
		var p *bus.Publisher
		c, p = emulatorBus(t, cfg.ProjectID)
		d.Publisher = p
	})
	r := e.submit(validRequest())
	attrs := receive(t, c, r.TaskID)[r.TaskID]
	if attrs[task.AttrTenant] != e.tenant || attrs[task.AttrFamily] != "summarize" || attrs[task.AttrVariant] != prompts.DefaultVariant {
		t.Fatalf("attributes %v", attrs)
	}
}

// TestPublishLostThenSwept: Pub/Sub is unavailable during the submit, the task is accepted
// (202) and due by now+grace, and one sweeper pass after the grace publishes its nudge.
func TestPublishLostThenSwept(t *testing.T) {
	t.Parallel()
	var c *pubsub.Client
	var real *bus.Publisher
	e := setup(t, func(cfg *Config, d *Deps) {
		c, real = emulatorBus(t, cfg.ProjectID)
		failing := &testenv.Publisher{}
		failing.SetPublishFunc(func(context.Context, string, []byte, map[string]string) error {
			return errors.New("pubsub: unavailable")
		})
		d.Publisher = failing
	})
	before := time.Now().UTC()
	code, _, body := e.do("POST", "/v1/tasks", e.key, mustJSON(t, validRequest()), nil)
	if code != http.StatusAccepted {
		t.Fatalf("submit with Pub/Sub down: %d %s", code, body)
	}
	var resp client.SubmitResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	id := resp.TaskID
	doc, err := e.st.GetTask(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if doc.DueAt == nil || doc.DueAt.Before(before) || doc.DueAt.After(time.Now().Add(e.cfg.NudgeGrace)) {
		t.Fatalf("due_at %v, want within now+%s", doc.DueAt, e.cfg.NudgeGrace)
	}
	// A sweeper pass before the grace leaves it alone; one after it publishes the nudge.
	cfg, err := sweeper.FromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	cfg.LeaderTTL = time.Minute
	if n, err := sweeper.New(e.st, real, nil, slog.New(slog.DiscardHandler), cfg, "test").Pass(context.Background()); err != nil || n != 0 {
		t.Fatalf("pass within the grace nudged %d: %v", n, err)
	}
	later := *e.st
	later.Now = func() time.Time { return time.Now().Add(e.cfg.NudgeGrace + time.Second) }
	if n, err := sweeper.New(&later, real, nil, slog.New(slog.DiscardHandler), cfg, "test").Pass(context.Background()); err != nil || n != 1 {
		t.Fatalf("pass after the grace nudged %d: %v", n, err)
	}
	receive(t, c, id)
}

// BenchmarkSubmit measures POST /v1/tasks end to end (HTTP, auth, validation, Firestore create,
// Pub/Sub publish) on the emulators; compare with BenchmarkBareCreatePublish.
func BenchmarkSubmit(b *testing.B) {
	e := setup(b, func(cfg *Config, d *Deps) { _, d.Publisher = emulatorBus(b, cfg.ProjectID) })
	body := mustJSON(b, validRequest())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchWorkers}}
	runBench(b, func() error {
		req, _ := http.NewRequest("POST", e.url+"/v1/tasks", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body) // read to the end, so the connection is reused
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// BenchmarkBareCreatePublish is the floor: the Firestore create and Pub/Sub publish the handler
// performs, called directly.
func BenchmarkBareCreatePublish(b *testing.B) {
	e := setup(b, func(cfg *Config, d *Deps) { _, d.Publisher = emulatorBus(b, cfg.ProjectID) })
	runBench(b, func() error { return createPublish(e, e.tenant) })
}

// BenchmarkBareAuthCreatePublish adds the API key read the handler must do (revocation applies
// at once, so it is not cached) to the bare create and publish.
func BenchmarkBareAuthCreatePublish(b *testing.B) {
	e := setup(b, func(cfg *Config, d *Deps) { _, d.Publisher = emulatorBus(b, cfg.ProjectID) })
	runBench(b, func() error {
		tenant, err := e.st.Authenticate(context.Background(), e.key)
		if err != nil {
			return err
		}
		return createPublish(e, tenant)
	})
}

// createPublish writes a task as the handler does and publishes its nudge.
func createPublish(e *env, tenant string) error {
	now := time.Now().UTC()
	grace := now.Add(30 * time.Second)
	t := &store.Task{ID: randomID(), Tenant: tenant, Family: "summarize", Variant: "default", Input: "text to work on",
		Labels: map[string]string{"app": "x"}, State: task.StateQueued, Delivery: store.Delivery{State: task.DeliveryNone},
		CreatedAt: now, NudgeAt: &grace}
	if err := e.st.CreateTask(context.Background(), t); err != nil {
		return err
	}
	_, err := e.srv.pub.Publish(context.Background(), bus.TopicTasks, nil, map[string]string{
		task.AttrTaskID: t.ID, task.AttrTenant: t.Tenant, task.AttrFamily: t.Family, task.AttrVariant: t.Variant})
	return err
}

const benchWorkers = 8

// runBench runs op b.N times on benchWorkers goroutines and reports throughput and latency
// percentiles.
func runBench(b *testing.B, op func() error) {
	for range benchWorkers { // warm connections and publishers
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, b.N)
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var failed error
	b.ResetTimer()
	start := time.Now()
	for range benchWorkers {
		wg.Go(func() {
			for i := range next {
				t0 := time.Now()
				if err := op(); err != nil {
					once.Do(func() { failed = err })
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	for i := range b.N {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "subs/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
