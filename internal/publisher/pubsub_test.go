package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/internal/testenv"
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
	var resp task.SubmitResponse
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
