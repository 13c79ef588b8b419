package devstack

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// syncBuffer is an output sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testEnv is the services' environment in tests: short leases, backoffs and sweeps.
func testEnv(extra ...string) func(string) string {
	e := map[string]string{
		"FIRESTORE_EMULATOR_HOST":     os.Getenv("FIRESTORE_EMULATOR_HOST"),
		"PUBSUB_EMULATOR_HOST":        os.Getenv("PUBSUB_EMULATOR_HOST"),
		"GENBOX_BACKOFF_BASE":         "10ms",
		"GENBOX_BACKOFF_MAX":          "50ms",
		"GENBOX_LEASE_TTL":            "2s",
		"GENBOX_LEASE_RENEW":          "500ms",
		"GENBOX_MAX_EXTENSION":        "1m",
		"GENBOX_SWEEP_INTERVAL":       "200ms",
		"GENBOX_SWEEP_LEADER_TTL":     "1s",
		"GENBOX_SWEEP_BACKOFF_BASE":   "500ms",
		"GENBOX_SWEEP_BACKOFF_MAX":    "1s",
		"GENBOX_NUDGE_GRACE":          "2s",
		"GENBOX_NOTICE_GRACE":         "1s",
		"GENBOX_RETRY_BASE":           "50ms",
		"GENBOX_RETRY_MAX":            "200ms",
		"GENBOX_SHUTDOWN_GRACE":       "1s",
		"GENBOX_DELIVERY_BACKOFF_MIN": "50ms",
		"GENBOX_DELIVERY_BACKOFF_MAX": "200ms",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		e[extra[i]] = extra[i+1]
	}
	return func(k string) string { return e[k] }
}

// setup starts a stack of the test's own project on free ports.
func setup(t *testing.T, extra ...string) (*Stack, *syncBuffer) {
	t.Helper()
	out := &syncBuffer{}
	cfg, err := FromEnv(testEnv(extra...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Project = emulator.ProjectID(t)
	cfg.PublisherAddr, cfg.DLQAddr, cfg.SlackAddr, cfg.WebhookAddr, cfg.GeminiAddr =
		"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Out = out
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s, out
}

// A task submitted over REST with the dev tenant's key succeeds and its webhook reaches the
// listener, signed with the dev tenant's secret and verified there.
func TestSubmitEndsInVerifiedWebhook(t *testing.T) {
	t.Parallel()
	s, out := setup(t)
	if s.Info.EmulatorsStarted {
		t.Error("the stack started emulators although the environment names running ones")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client.New(s.Info.Publisher, s.Info.APIKey)
	marker := "report-" + s.Info.Project // the fake's ledger finds the task's bills by its prompt
	res, err := c.Submit(ctx, task.Request{Family: "summarize", Input: "The " + marker + " says the fox jumped.", CallbackURL: s.Info.WebhookURL})
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Wait(ctx, res.TaskID, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if v.State != task.StateSucceeded || v.Output == nil {
		t.Fatalf("task ended %s (output %v)", v.State, v.Output)
	}
	d, err := s.Inbox.Wait(ctx, func(d Delivery) bool { return d.Event.Data.TaskID == res.TaskID })
	if err != nil {
		t.Fatal(err)
	}
	if want := task.EventID(res.TaskID, task.EventSucceeded, 0); d.ID != want {
		t.Errorf("webhook-id %q, want %q", d.ID, want)
	}
	if d.Event.Type != task.EventSucceeded || d.Event.Data.Output == nil || *d.Event.Data.Output != *v.Output {
		t.Errorf("webhook event %+v does not carry the task's output", d.Event)
	}
	if !strings.Contains(out.String(), "verified webhook-id="+d.ID) {
		t.Errorf("the listener did not print the verified delivery:\n%s", out.String())
	}
	if n := len(s.Fake.Ledger().BillsFor(marker)); n != 1 {
		t.Errorf("task billed %d times, want 1", n)
	}
}
