package dlqnotifier

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

const (
	testChannel  = "C0DLQ"
	testSecret   = "8f742231b10e8888abcd99yyyzzz85a5"
	testApprover = "U0APPROVER"
	testOutsider = "U0OUTSIDER"
	testAdminKey = "admin-key-for-tests"
	testTenant   = "acme"
)

var _ Publisher = (*testenv.Publisher)(nil)

type env struct {
	ctx   context.Context
	fs    *firestore.Client
	st    *store.Store
	clock *testenv.Clock
	slack *doubles.Slack
	pub   *testenv.Publisher
	svc   *Service
	http  *httptest.Server
	cfg   Config
	logs  *bytes.Buffer
}

func testConfig(slackURL string) Config {
	return Config{
		Port: 0, Project: "p", BotToken: "xoxb-test", SigningSecret: testSecret, Channel: testChannel,
		Approvers: []string{testApprover}, SlackAPIURL: slackURL, AdminKey: testAdminKey, Consumer: ConsumerPush, UnauthenticatedPush: true,
		Instance: "dn-1", TasksDLQSub: bus.SubTasksDLQ, ResultsDLQSub: bus.SubResultsDLQ, AlertsSub: bus.SubAlerts, ProxyHops: 1,
		Policy: Policy{
			AlertCooldown: time.Minute, PostLease: 30 * time.Second,
			PostBackoffBase: 10 * time.Second, PostBackoffMax: time.Minute, FollowUpGrace: time.Minute,
			FloodWindow: time.Hour,
		},
		ShutdownGrace: time.Second,
	}
}

func setup(t testing.TB) *env {
	t.Helper()
	ctx := context.Background()
	fs := testenv.Firestore(t, emulator.ProjectID(t))
	c := testenv.NewClock(time.Now().UTC().Truncate(time.Microsecond))
	st := store.New(fs)
	st.Now = c.Now
	st.MaxAttempts = 30
	sd := &doubles.Slack{Token: "xoxb-test"}
	slackSrv := httptest.NewServer(sd)
	t.Cleanup(slackSrv.Close)
	cfg := testConfig(slackSrv.URL)
	logs := &bytes.Buffer{}
	e := &env{ctx: ctx, fs: fs, st: st, clock: c, slack: sd, pub: &testenv.Publisher{}, cfg: cfg, logs: logs}
	e.svc = New(cfg, st, NewSlackClient(cfg), e.pub, nil, slog.New(slog.DiscardHandler))
	e.http = httptest.NewServer(e.svc.Handler())
	t.Cleanup(e.http.Close)
	return e
}

// deadTask writes a task that died in generation (replay 0) with its DLQ notice, as the worker
// leaves it: spent tokens recorded, the task.dead event queued.
func (e *env) deadTask(t testing.TB, id string, mutate ...func(*protocol.Task)) *protocol.Task {
	t.Helper()
	now := e.clock.Now()
	tk := &protocol.Task{ID: id, Tenant: testTenant, Family: "summarize", Variant: "default", Input: "summarize " + id,
		State: task.StateRunning, CreatedAt: now, Attempts: 3, ModelCalls: 6,
		Usage: task.Usage{PromptTokens: 300, OutputTokens: 0, TotalTokens: 300}, CostUSD: 0.0006,
		Error: &protocol.TaskError{Kind: task.KindTransient, Code: 503, Message: "model overloaded"}}
	for _, m := range mutate {
		m(tk)
	}
	next := now.Add(time.Minute)
	tk.Notices = append(tk.Notices, protocol.Notice{Stage: task.StageGeneration, Replay: tk.Replay, NextAttemptAt: &next})
	tk.Finish(task.StateDead, now)
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
	return tk
}

// deliveryDeadTask writes a failed task whose task.failed webhook died (round 0), with its notice.
func (e *env) deliveryDeadTask(t testing.TB, id string) *protocol.Task {
	t.Helper()
	now := e.clock.Now()
	tk := &protocol.Task{ID: id, Tenant: testTenant, Family: "classify", Variant: "default", Input: "x",
		CallbackURL: "https://app.example/hook", State: task.StateRunning, CreatedAt: now,
		Error: &protocol.TaskError{Kind: task.KindPermanent, Code: 400, Message: "bad request"}}
	tk.Finish(task.StateFailed, now)
	tk.Delivery.State, tk.Delivery.Attempts, tk.Delivery.LastStatus = task.DeliveryDead, 4, 410
	tk.Delivery.NextAttemptAt = nil
	next := now.Add(time.Minute)
	tk.Notices = append(tk.Notices, protocol.Notice{Stage: task.StageDelivery, NextAttemptAt: &next})
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
	return tk
}

// noticeMsg is the message a DLQ notice arrives as.
func noticeMsg(id string, n protocol.Notice) *bus.Message {
	return &bus.Message{ID: "n-" + id, Attributes: n.Attributes(id)}
}

func (e *env) deadLetter(t testing.TB, id string) *store.DeadLetter {
	t.Helper()
	d, err := e.st.GetDeadLetter(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// interaction is a block_actions payload as Slack sends it when user clicks action on dlID.
func interaction(user string, action Action, dlID string) []byte {
	cb := map[string]any{
		"type":         "block_actions",
		"user":         map[string]any{"id": user, "username": "someone"},
		"channel":      map[string]any{"id": testChannel},
		"response_url": "https://hooks.slack.example/actions/expired",
		"trigger_id":   "1.2.3",
		"actions": []map[string]any{{
			"action_id": string(action), "block_id": "dlq:" + dlID, "value": dlID, "type": "button",
			"action_ts": "1700000000.000001",
		}},
	}
	payload, _ := json.Marshal(cb)
	return []byte(url.Values{"payload": {string(payload)}}.Encode())
}

// click posts body to /slack/interactions signed with secret at ts.
func (e *env) click(t testing.TB, body []byte, secret string, ts time.Time) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.http.URL+InteractionsPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range SignSlackRequest(secret, ts, body) {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// approve clicks action on dlID as the approver, validly signed now.
func (e *env) approve(t testing.TB, action Action, dlID string) {
	t.Helper()
	if code := e.click(t, interaction(testApprover, action, dlID), testSecret, time.Now()); code != http.StatusOK {
		t.Fatalf("click %s: %d", action, code)
	}
}

// blocksOf decodes the Block Kit blocks of a recorded call.
func blocksOf(t testing.TB, c doubles.SlackCall) slack.Blocks {
	t.Helper()
	var b slack.Blocks
	if err := json.Unmarshal([]byte(c.Form.Get("blocks")), &b); err != nil {
		t.Fatalf("blocks %q: %v", c.Form.Get("blocks"), err)
	}
	return b
}

// textOf joins the section texts of a recorded call's blocks.
func textOf(t testing.TB, c doubles.SlackCall) string {
	t.Helper()
	var parts []string
	for _, b := range blocksOf(t, c).BlockSet {
		if sec, ok := b.(*slack.SectionBlock); ok && sec.Text != nil {
			parts = append(parts, sec.Text.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// buttons lists the (action id, label, value) of a message's buttons.
func buttons(t testing.TB, c doubles.SlackCall) [][3]string {
	t.Helper()
	var out [][3]string
	for _, b := range blocksOf(t, c).BlockSet {
		if a, ok := b.(*slack.ActionBlock); ok {
			for _, el := range a.Elements.ElementSet {
				if btn, ok := el.(*slack.ButtonBlockElement); ok {
					out = append(out, [3]string{btn.ActionID, btn.Text.Text, btn.Value})
				}
			}
		}
	}
	return out
}

// sweeper is a sweeper over the test's store, with a publisher of its own to count its nudges.
func (e *env) sweeper() (*sweeper.Sweeper, *testenv.Publisher) {
	pub := &testenv.Publisher{}
	return sweeper.New(e.st, pub, nil, slog.New(slog.DiscardHandler), sweeper.Config{
		Interval: time.Second, Limit: 10, Pace: 1000, ReleaseRate: 10, LeaderTTL: 3 * time.Second,
		BackoffBase: time.Second, BackoffMax: time.Second,
	}, "sw"), pub
}

// handleWhileSlackHolds handles m in the background with the Slack double holding its call,
// and returns once that call has reached Slack; finish lets Slack answer every call from then on
// and returns what the handling returned (Slack is let go at the test's end in any case).
func (e *env) handleWhileSlackHolds(t testing.TB, m *bus.Message) (finish func() bus.Result) {
	t.Helper()
	arrived, release := e.slack.HoldNextPost()
	t.Cleanup(release)
	res := make(chan bus.Result, 1)
	go func() { res <- e.svc.Handle(e.ctx, m) }()
	<-arrived
	return sync.OnceValue(func() bus.Result {
		release()
		return <-res
	})
}
