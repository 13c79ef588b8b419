package devstack

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
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
	return StartTestWith(t, func(cfg *Config) { cfg.Out = out }, extra...)
}

// StartTestWith is StartTest with set applied to the configuration before the stack starts: a
// harness's own logger, telemetry or webhook secret.
func StartTestWith(t testing.TB, set func(*Config), extra ...string) *Stack {
	t.Helper()
	cfg, err := FromEnv(ShortEnv(extra...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Project = emulator.ProjectID(t)
	cfg.PublisherAddr, cfg.DLQAddr, cfg.SlackAddr, cfg.WebhookAddr, cfg.GeminiAddr =
		"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	set(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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

// SubmitWait submits req over REST with the dev tenant's API key, its webhook sent to the
// stack's listener unless req names another callback, and returns the task once it has ended
// (in whatever state). It fails t if the submission or the wait fails, ctx ending included.
func (s *Stack) SubmitWait(t testing.TB, ctx context.Context, req task.Request) *task.View {
	t.Helper()
	if req.CallbackURL == "" {
		req.CallbackURL = s.Info.WebhookURL
	}
	c := client.New(s.Info.Publisher, s.Info.APIKey)
	res, err := c.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Wait(ctx, res.TaskID, 50*time.Millisecond)
	if err != nil {
		t.Fatalf("wait for task %s: %v", res.TaskID, err)
	}
	return v
}

// WaitDeadLetterNotified waits until the dlqnotifier has shown dead letter dlID to the
// operators — posted it with its buttons, or counted it in its tenant's flood message (a
// receiver refusing every delivery is one message, not one per task) — and returns it. It fails
// t if that does not happen before ctx ends.
func (s *Stack) WaitDeadLetterNotified(t testing.TB, ctx context.Context, dlID string) *store.DeadLetter {
	t.Helper()
	for {
		dl, err := s.Store.GetDeadLetter(ctx, dlID)
		if err == nil && (dl.SlackTS != "" || dl.SlackFlood != "") {
			return dl
		}
		if ctx.Err() != nil {
			t.Fatalf("the dead letter %s was never shown in Slack: %+v %v", dlID, dl, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitDeadLetterPosted waits until the dlqnotifier has posted dead letter dlID to the Slack
// double and committed the message's ts, from which on the console shows its buttons, and
// returns the post. It fails t if that does not happen before ctx ends.
func (s *Stack) WaitDeadLetterPosted(t testing.TB, ctx context.Context, dlID string) doubles.SlackCall {
	t.Helper()
	post, err := s.Slack.WaitCall(ctx, func(c doubles.SlackCall) bool {
		return c.Method == "chat.postMessage" && strings.Contains(c.Form.Get("blocks"), dlID)
	})
	if err != nil {
		t.Fatalf("the dead letter %s was not posted to Slack: %v", dlID, err)
	}
	for {
		dl, err := s.Store.GetDeadLetter(ctx, dlID)
		if err == nil && dl.SlackTS == post.TS {
			return post
		}
		if ctx.Err() != nil {
			t.Fatalf("the dead letter %s never recorded its Slack message: %+v %v", dlID, dl, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
