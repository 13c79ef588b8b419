package devstack

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
)

// ShortEnv is a service environment for tests: the emulators of this process, and ms-scale
// leases, backoffs and sweeps; extra holds name, value pairs that override or add variables.
func ShortEnv(extra ...string) func(string) string {
	e := map[string]string{
		emulator.FirestoreHostEnv:     os.Getenv(emulator.FirestoreHostEnv),
		emulator.PubSubHostEnv:        os.Getenv(emulator.PubSubHostEnv),
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
		"GENBOX_DECISION_GRACE":       "2s",
		"GENBOX_SLACK_POST_LEASE":     "5s",
		"GENBOX_SLACK_BACKOFF_BASE":   "100ms",
		"GENBOX_SLACK_BACKOFF_MAX":    "1s",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		e[extra[i]] = extra[i+1]
	}
	return func(k string) string { return e[k] }
}

// StartTest starts a stack of t's own project (emulator.ProjectID) on free loopback ports with
// ShortEnv(extra...), printing the listener's output to out (nil discards it), and closes it
// when t ends. Use it from a test binary whose TestMain runs emulator.RunTests.
func StartTest(t testing.TB, out io.Writer, extra ...string) *Stack {
	t.Helper()
	cfg, err := FromEnv(ShortEnv(extra...))
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
			t.Errorf("close the dev stack: %v", err)
		}
	})
	return s
}
