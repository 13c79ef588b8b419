package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/console"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// The service end to end on the emulators, in both consumer modes: a DLQ notice published on
// gemini-tasks-dlq becomes a Slack post, a signed Discard click updates it, an alert on
// genbox-alerts is posted, and cancelling ctx shuts it down cleanly.
func TestRun(t *testing.T) {
	t.Parallel()
	testenv.EachConsumer(t, testRun, dlqnotifier.ConsumerPush, dlqnotifier.ConsumerPull)
}

func testRun(t *testing.T, mode string) { //nolint:thelper // the body of TestRun's subtests: a failure names its own line
	ctx := context.Background()
	top := bus.DefaultTopology()
	top.MinBackoff, top.MaxBackoff = time.Second, 2*time.Second
	p := testenv.NewProject(t, top)
	project, ps, st := p.ID, p.PubSub, p.Store

	var svc *testenv.Service // started once the fake Slack serves
	slack := &doubles.Slack{}
	slackSrv := httptest.NewServer(slack)
	defer slackSrv.Close()
	// A click can land while the post is being recorded: the poster then updates the message
	// too (notice.go, "decided while the post was in flight"), so once the message has been
	// updated, further chat.update calls are the same update again and are skipped.
	updated := false
	taken := 0 // the calls next has gone past
	next := func(want string) doubles.SlackCall {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n := 0
		c, err := slack.WaitCall(wctx, func(c doubles.SlackCall) bool {
			n++
			return n > taken && (c.Method != "chat.update" || want == c.Method || !updated)
		})
		if err != nil {
			t.Fatalf("no %s\n%s", want, svc.Log.String())
		}
		taken = n
		if c.Method != want {
			t.Fatalf("Slack call %s, want %s", c.Method, want)
		}
		updated = updated || c.Method == "chat.update"
		return c
	}

	const secret = "signing-secret"
	env := map[string]string{
		"GOOGLE_CLOUD_PROJECT": project, "PORT": "0", "GENBOX_CONSUMER": mode,
		"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": secret, "GENBOX_SLACK_CHANNEL": "C1",
		"GENBOX_SLACK_APPROVERS": "U1", "GENBOX_SLACK_API_URL": slackSrv.URL, "GENBOX_SHUTDOWN_GRACE": "3s",
		"GENBOX_UNAUTHENTICATED_PUSH": "1", // the emulator pushes without a token
	}
	svc = testenv.Start(t, run, env)
	base := svc.Started(t, "dlqnotifier", 20*time.Second)
	if mode == dlqnotifier.ConsumerPush { // now that the port is known
		testenv.PushTo(t, ps, top, base+dlqnotifier.PushPath, bus.SubTasksDLQ, bus.SubResultsDLQ, bus.SubAlerts)
	}
	testenv.Ready(t, base, 30*time.Second)

	now := time.Now()
	tk := &protocol.Task{ID: "t-run", Tenant: "acme", Family: "summarize", Input: "x", State: task.StateRunning, CreatedAt: now,
		Error: &protocol.TaskError{Kind: task.KindTransient, Message: "overloaded"}}
	tk.Notices = []protocol.Notice{{Stage: task.StageGeneration}}
	tk.Finish(task.StateDead, now)
	if err := st.CreateTask(ctx, tk); err != nil {
		t.Fatal(err)
	}
	pub := bus.NewPublisher(ps)
	defer pub.Close()
	if _, err := pub.Publish(ctx, bus.TopicTasksDLQ, nil, tk.Notices[0].Attributes(tk.ID)); err != nil {
		t.Fatal(err)
	}
	post := next("chat.postMessage")
	if !strings.Contains(post.Form.Get("blocks"), "regenerate") {
		t.Fatalf("post %v", post.Form)
	}

	payload, _ := json.Marshal(map[string]any{
		"type": "block_actions", "user": map[string]any{"id": "U1"}, "channel": map[string]any{"id": "C1"},
		"actions": []map[string]any{{"action_id": "discard", "block_id": "dlq:t-run:generation:0:0", "value": "t-run:generation:0:0", "type": "button"}},
	})
	body := []byte(url.Values{"payload": {string(payload)}}.Encode())
	req, _ := http.NewRequest(http.MethodPost, base+dlqnotifier.InteractionsPath, bytes.NewReader(body))
	for k, v := range dlqnotifier.SignSlackRequest(secret, time.Now(), body) {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("click: %v %v", resp, err)
	}
	resp.Body.Close()
	if upd := next("chat.update"); upd.TS != post.TS {
		t.Fatalf("update %v, want of the post's message %s", upd.Form, post.TS)
	}
	if got, err := st.GetTask(ctx, "t-run"); err != nil || got.State != task.StateDiscarded {
		t.Fatalf("task %v %v", got, err)
	}

	if _, err := pub.Publish(ctx, bus.TopicAlerts, []byte("breaker open"), map[string]string{task.AttrKind: "alert", task.AttrAlert: "breaker:m"}); err != nil {
		t.Fatal(err)
	}
	if alert := next("chat.postMessage"); !strings.Contains(alert.Form.Get("text"), "breaker open") {
		t.Fatalf("alert %v", alert.Form)
	}

	svc.StopClean(t)
}

func TestRunConfigError(t *testing.T) {
	t.Parallel()
	valid := map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s",
		"GENBOX_SLACK_CHANNEL": "C1", "GENBOX_SLACK_APPROVERS": "U1", "GENBOX_UNAUTHENTICATED_PUSH": "1"}
	for _, c := range []struct{ name, value string }{
		{"GENBOX_CONSUMER", "poll"},
		{"GENBOX_PRICES", "gemini-2.5-flash=cheap"},
		// The families the Regenerate button renders must load, as in the publisher and worker.
		{"GENBOX_PROMPTS_DIR", filepath.Join(t.TempDir(), "missing")},
	} {
		err := run(testenv.Ended(), func(k string) string {
			if k == c.name {
				return c.value
			}
			return valid[k]
		}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s=%s: run answered %v, want an error naming it", c.name, c.value, err)
		}
	}
}

// Behind an external HTTPS load balancer (Identity-Aware Proxy in front of the console) the last
// address of X-Forwarded-For is the balancer's and the client's is the one before it: with
// GENBOX_TRUSTED_PROXY_HOPS=2, one client's failed keys — on the admin routes or the console's
// login-token — do not hold back another's behind the same balancer.
func TestTrustedProxyHops(t *testing.T) {
	t.Parallel()
	p := testenv.NewProject(t, bus.DefaultTopology())
	const adminKey = "admin-key-0123456789abcdef"
	svc := testenv.Start(t, run, map[string]string{
		"GOOGLE_CLOUD_PROJECT": p.ID, "PORT": "0", "GENBOX_CONSUMER": dlqnotifier.ConsumerPull,
		"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "signing-secret", "GENBOX_SLACK_CHANNEL": "C1",
		"GENBOX_SLACK_APPROVERS": "U1", "GENBOX_SLACK_API_URL": "http://127.0.0.1:9", "GENBOX_SHUTDOWN_GRACE": "3s",
		"GENBOX_ADMIN_KEY": adminKey, "GENBOX_TRUSTED_PROXY_HOPS": "2",
	})
	base := svc.Started(t, "dlqnotifier", 20*time.Second)
	const balancer = "34.120.0.1"
	send := func(method, path, client string) int {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(`{"operator":"alice"}`))
		req.Header.Set("Authorization", "Bearer wrong-key-of-the-right-length")
		req.Header.Set("X-Forwarded-For", client+", "+balancer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	throttled := 0
	for range 40 { // a burst of 20, then one a second
		if send(http.MethodGet, dlqnotifier.AdminPrefix, "203.0.113.1") == http.StatusTooManyRequests {
			throttled++
		}
		if send(http.MethodPost, console.LoginTokenPath, "203.0.113.1") == http.StatusTooManyRequests {
			throttled++
		}
	}
	if throttled == 0 {
		t.Fatal("80 wrong keys from one client: none throttled")
	}
	if code := send(http.MethodGet, dlqnotifier.AdminPrefix, "198.51.100.2"); code != http.StatusForbidden {
		t.Errorf("another client's wrong admin key behind the same balancer: %d, want 403", code)
	}
	if code := send(http.MethodPost, console.LoginTokenPath, "198.51.100.2"); code != http.StatusForbidden {
		t.Errorf("another client's wrong key on login-token behind the same balancer: %d, want 403", code)
	}
	svc.StopClean(t)
}
