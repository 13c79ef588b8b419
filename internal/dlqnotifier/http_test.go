package dlqnotifier

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Only a validly signed, recent click by an approver, on an open dead letter, changes anything.
// Everything else leaves the task, the dead letter, the nudges and the message as they were.
func TestInteractionRefusals(t *testing.T) {
	t.Parallel()
	const dl = "t-guard:delivery:0:0"
	tests := []struct {
		name      string
		before    func(t *testing.T, e *env) // e.g. a first decision
		body      []byte
		secret    string
		ts        time.Time
		tamper    bool
		noHeaders bool
		wantCode  int
		ephemeral string // text the clicking user is told, "" for no Slack call at all
	}{
		{name: "forged signature", body: interaction(testApprover, ActionRedeliver, dl), secret: "not-the-secret", ts: time.Now(), wantCode: http.StatusUnauthorized},
		{name: "tampered body", body: interaction(testApprover, ActionRedeliver, dl), secret: testSecret, ts: time.Now(), tamper: true, wantCode: http.StatusUnauthorized},
		{name: "timestamp older than 5 minutes", body: interaction(testApprover, ActionRedeliver, dl), secret: testSecret, ts: time.Now().Add(-5*time.Minute - 10*time.Second), wantCode: http.StatusUnauthorized},
		{name: "timestamp in the future", body: interaction(testApprover, ActionRedeliver, dl), secret: testSecret, ts: time.Now().Add(6 * time.Minute), wantCode: http.StatusUnauthorized},
		{name: "no signature", body: interaction(testApprover, ActionRedeliver, dl), noHeaders: true, wantCode: http.StatusUnauthorized},
		{name: "non-approver", body: interaction(testOutsider, ActionRedeliver, dl), secret: testSecret, ts: time.Now(), wantCode: http.StatusOK, ephemeral: "Only genbox approvers"},
		{name: "action of the other stage", body: interaction(testApprover, ActionRegenerate, dl), secret: testSecret, ts: time.Now(), wantCode: http.StatusOK, ephemeral: "does not apply"},
		{name: "unknown dead letter", body: interaction(testApprover, ActionDiscard, "t-other:delivery:0:0"), secret: testSecret, ts: time.Now(), wantCode: http.StatusOK, ephemeral: "Nothing was changed"},
		{
			name: "second click",
			before: func(t *testing.T, e *env) {
				t.Helper()
				e.approve(t, ActionRedeliver, dl)
			},
			body: interaction(testApprover, ActionDiscard, dl), secret: testSecret, ts: time.Now(), wantCode: http.StatusOK,
			ephemeral: "already decided by <@" + testApprover + "> at ",
		},
		{
			name: "task moved on",
			before: func(t *testing.T, e *env) {
				t.Helper()
				if _, err := e.st.MutateTask(e.ctx, "t-guard", func(tk *protocol.Task, now time.Time) error {
					tk.Delivery.State, tk.Delivery.DeliveredAt = task.DeliveryDelivered, &now
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			},
			body: interaction(testApprover, ActionRedeliver, dl), secret: testSecret, ts: time.Now(), wantCode: http.StatusOK,
			ephemeral: "moved on",
		},
		{name: "not a payload", body: []byte("payload=%7Bnot+json"), secret: testSecret, ts: time.Now(), wantCode: http.StatusBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			tk := e.deliveryDeadTask(t, "t-guard")
			e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
			if tc.before != nil {
				tc.before(t, e)
			}
			taskBefore, dlBefore := testenv.GetTask(t, e.st, tk.ID), e.deadLetter(t, dl)
			pubBefore, slackBefore := len(e.pub.On(bus.TopicResults)), len(e.slack.Calls(""))

			req, _ := http.NewRequest(http.MethodPost, e.http.URL+InteractionsPath, bytes.NewReader(tc.body))
			if !tc.noHeaders {
				for k, v := range SignSlackRequest(tc.secret, tc.ts, tc.body) {
					req.Header[k] = v
				}
			}
			if tc.tamper {
				req, _ = http.NewRequest(http.MethodPost, e.http.URL+InteractionsPath,
					bytes.NewReader(interaction(testApprover, ActionDiscard, dl)))
				for k, v := range SignSlackRequest(tc.secret, tc.ts, tc.body) {
					req.Header[k] = v
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantCode)
			}

			taskAfter, dlAfter := testenv.GetTask(t, e.st, tk.ID), e.deadLetter(t, dl)
			if !taskAfter.UpdateTime.Equal(taskBefore.UpdateTime) || dlAfter.State != dlBefore.State || dlAfter.DecidedBy != dlBefore.DecidedBy || !dlAfter.UpdatedAt.Equal(dlBefore.UpdatedAt) {
				t.Fatalf("something changed: task %v→%v, dead letter %+v→%+v", taskBefore.UpdateTime, taskAfter.UpdateTime, dlBefore, dlAfter)
			}
			if n := len(e.pub.On(bus.TopicResults)); n != pubBefore {
				t.Fatalf("nudges published: %d→%d", pubBefore, n)
			}
			calls := e.slack.Calls("")[slackBefore:]
			if tc.ephemeral == "" {
				if len(calls) != 0 {
					t.Fatalf("Slack called: %+v", calls)
				}
				return
			}
			if len(calls) != 1 || calls[0].Method != "chat.postEphemeral" || !strings.Contains(calls[0].Form.Get("text"), tc.ephemeral) {
				t.Fatalf("want one ephemeral answer containing %q, got %+v", tc.ephemeral, calls)
			}
			user := testApprover
			if tc.name == "non-approver" {
				user = testOutsider
			}
			if calls[0].Form.Get("user") != user || calls[0].Form.Get("channel") != testChannel {
				t.Fatalf("ephemeral to %q in %q", calls[0].Form.Get("user"), calls[0].Form.Get("channel"))
			}
		})
	}
}

// An oversized interaction body is refused before anything else.
func TestInteractionBodyCap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := []byte("payload=" + strings.Repeat("a", MaxInteractionBytes))
	if code := e.click(t, body, testSecret, time.Now()); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", code)
	}
}

// The admin path lists and shows dead letters and decides through the same decision as Slack;
// it needs the Bearer key, checked as the publisher checks its own (a wrong key is a 403). A
// decision is recorded as the admin key's, whatever name the body gives; what it shows of a dead
// letter leaves out how its Slack message is kept; every refusal is a problem document.
func TestAdmin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, id := range []string{"t-admin-1", "t-admin-2"} {
		tk := e.deliveryDeadTask(t, id)
		e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
		e.clock.Add(time.Second)
	}
	do := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, e.http.URL+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode >= 400 && (ct != task.ProblemContentType || out["type"] == nil || out["title"] == nil || out["status"] != float64(resp.StatusCode)) {
			t.Errorf("%s %s: a %d answered %s %v, want a problem document", method, path, resp.StatusCode, ct, out)
		}
		return resp.StatusCode, out
	}
	operator := httpapi.NewAdminKey(testAdminKey).Operator()
	tests := []struct {
		name, method, path, key, body string
		want                          int
		check                         func(t *testing.T, out map[string]any)
	}{
		{name: "no key", method: "GET", path: AdminPrefix, want: http.StatusUnauthorized},
		{name: "wrong key", method: "GET", path: AdminPrefix, key: "nope-nope-nope-nope", want: http.StatusForbidden},
		{name: "list open", method: "GET", path: AdminPrefix + "?state=open", key: testAdminKey, want: http.StatusOK,
			check: func(t *testing.T, out map[string]any) {
				t.Helper()
				l, _ := out["dead_letters"].([]any)
				if len(l) != 2 || l[0].(map[string]any)["id"] != "t-admin-1:delivery:0:0" {
					t.Fatalf("list %v", out)
				}
			}},
		{name: "show", method: "GET", path: AdminPrefix + "/t-admin-2:delivery:0:0", key: testAdminKey, want: http.StatusOK,
			check: func(t *testing.T, out map[string]any) {
				t.Helper()
				if out["task_id"] != "t-admin-2" || out["state"] != "open" {
					t.Fatalf("show %v", out)
				}
				for _, field := range []string{"slack_ts", "slack_channel", "post_attempts"} {
					if _, ok := out[field]; ok {
						t.Errorf("show exposes the store's %s: %v", field, out)
					}
				}
			}},
		{name: "show missing", method: "GET", path: AdminPrefix + "/t-none:delivery:0:0", key: testAdminKey, want: http.StatusNotFound},
		{name: "not JSON", method: "POST", path: AdminPrefix + "/t-admin-1:delivery:0:0:redeliver", key: testAdminKey, body: `ops`, want: http.StatusBadRequest},
		{name: "no action", method: "POST", path: AdminPrefix + "/t-admin-1", key: testAdminKey, want: http.StatusNotFound},
		{name: "wrong stage", method: "POST", path: AdminPrefix + "/t-admin-1:delivery:0:0:regenerate", key: testAdminKey, body: `{"operator":"ops"}`, want: http.StatusBadRequest},
		{name: "redeliver", method: "POST", path: AdminPrefix + "/t-admin-1:delivery:0:0:redeliver", key: testAdminKey, body: `{"operator":"ops"}`, want: http.StatusOK,
			check: func(t *testing.T, out map[string]any) {
				t.Helper()
				if out["state"] != "redelivered" || out["decided_by"] != operator+` (says "ops")` {
					t.Fatalf("decision %v", out)
				}
			}},
		{name: "again", method: "POST", path: AdminPrefix + "/t-admin-1:delivery:0:0:discard", key: testAdminKey, want: http.StatusConflict,
			check: func(t *testing.T, out map[string]any) {
				t.Helper()
				if detail, _ := out["detail"].(string); !strings.Contains(detail, "already decided by "+operator) {
					t.Fatalf("error %v", out)
				}
			}},
		{name: "list open after", method: "GET", path: AdminPrefix, key: testAdminKey, want: http.StatusOK,
			check: func(t *testing.T, out map[string]any) {
				t.Helper()
				if l, _ := out["dead_letters"].([]any); len(l) != 1 {
					t.Fatalf("list %v", out)
				}
			}},
		{name: "bad limit", method: "GET", path: AdminPrefix + "?limit=0", key: testAdminKey, want: http.StatusBadRequest},
	}
	for _, tc := range tests { // in order: the decisions build on each other
		code, out := do(tc.method, tc.path, tc.key, tc.body)
		if code != tc.want {
			t.Fatalf("%s: status %d, want %d (%v)", tc.name, code, tc.want, out)
		}
		if tc.check != nil {
			tc.check(t, out)
		}
	}
	got := testenv.GetTask(t, e.st, "t-admin-1")
	if got.Delivery.State != task.DeliveryPending || got.Delivery.Round != 1 || e.nudged(bus.TopicResults, "t-admin-1") != 1 {
		t.Fatalf("admin redeliver: %+v", got.Delivery)
	}
	if u := e.slack.Calls("chat.update"); len(u) != 1 || !strings.Contains(textOf(t, u[0]), "Redelivered* by "+operator) {
		t.Fatalf("chat.update %+v", u)
	}
}

// SignSlackRequest signs exactly as Slack does: slack-go's verifier accepts it.
func TestSignSlackRequest(t *testing.T) {
	t.Parallel()
	body := interaction(testApprover, ActionDiscard, "x:delivery:0:0")
	h := SignSlackRequest(testSecret, time.Now(), body)
	if err := verifySlack(h, body, testSecret); err != nil {
		t.Fatal(err)
	}
	if err := verifySlack(h, append(body, '&'), testSecret); err == nil {
		t.Fatal("a changed body verified")
	}
	// Slack's documented example request.
	ex := []byte("token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c")
	got := SignSlackRequest(testSecret, time.Unix(1531420618, 0), ex).Get(HeaderSlackSignature)
	if got != "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503" {
		t.Fatalf("signature %s", got)
	}
}

// FuzzSlackPayload: the interaction decoder never panics, and what it accepts has the payload's
// actions.
func FuzzSlackPayload(f *testing.F) {
	f.Add(interaction(testApprover, ActionRegenerate, "t:generation:0:0"))
	f.Add([]byte("payload=%7B%7D"))
	f.Add([]byte("payload=%7B%22type%22%3A%22block_actions%22%2C%22actions%22%3A%5B%7B%7D%5D%7D"))
	f.Add([]byte("payload=null"))
	f.Add([]byte("a=%zz"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, body []byte) {
		cb, err := DecodeInteraction(body)
		if err != nil {
			if cb != nil {
				t.Fatal("a callback with an error")
			}
			return
		}
		form, perr := url.ParseQuery(string(body))
		if perr != nil || form.Get("payload") == "" {
			t.Fatalf("accepted a body without a payload: %q", body)
		}
		for _, a := range cb.ActionCallback.BlockActions {
			_ = Action(a.ActionID).appliesTo(task.StageGeneration)
			_, _, _ = protocol.ParseDeadLetterID(a.Value)
		}
	})
}

// BenchmarkClick measures an approver's click end to end on the emulator: signature check,
// the decision transaction (task and dead letter), the nudge, the follow-up write and the
// chat.update — everything Slack waits for (it allows 3 s).
func BenchmarkClick(b *testing.B) {
	e := setup(b)
	ids := make([]string, b.N)
	for i := range ids {
		tk := e.deliveryDeadTask(b, "t-bench-"+strconv.Itoa(i))
		e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
		ids[i] = tk.ID + ":delivery:0:0"
	}
	b.ResetTimer()
	for i := range b.N {
		e.approve(b, ActionRedeliver, ids[i])
	}
	b.StopTimer()
	if n := len(e.slack.Calls("chat.update")); n != b.N {
		b.Fatalf("%d updates for %d clicks", n, b.N)
	}
}

// send sends method path from the client address from (X-Forwarded-For, as Cloud Run's front end
// appends it) and returns the status; a 429 must say when to retry.
func (e *env) send(t *testing.T, method, path, from string, body []byte, hdr http.Header) int {
	t.Helper()
	req, _ := http.NewRequest(method, e.http.URL+path, bytes.NewReader(body))
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("X-Forwarded-For", from)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
		t.Fatal("a 429 without Retry-After")
	}
	return resp.StatusCode
}

// A client whose Slack signatures or admin keys keep failing is answered 429 once its burst is
// spent; Slack (another address) and the admin with the right key are not held back.
func TestFailedAuthThrottled(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.deliveryDeadTask(t, "t-throttle")
	e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
	dl := "t-throttle:delivery:0:0"
	burst := authlimit.DefaultConfig().ClientBurst
	const extra = 10
	click := interaction(testApprover, ActionRedeliver, dl)
	forged, admin := map[int]int{}, map[int]int{}
	for range burst + extra {
		forged[e.send(t, http.MethodPost, InteractionsPath, "203.0.113.1", click, SignSlackRequest("not-the-secret", time.Now(), click))]++
		admin[e.send(t, http.MethodGet, AdminPrefix, "203.0.113.2", nil, http.Header{"Authorization": {"Bearer wrong-key-of-the-right-length"}})]++
	}
	want := func(refused int) map[int]int { return map[int]int{refused: burst, http.StatusTooManyRequests: extra} }
	if diff := cmp.Diff(want(http.StatusUnauthorized), forged); diff != "" {
		t.Errorf("forged clicks (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want(http.StatusForbidden), admin); diff != "" {
		t.Errorf("wrong admin keys (-want +got):\n%s", diff)
	}
	if code := e.send(t, http.MethodPost, InteractionsPath, "198.51.100.1", click, SignSlackRequest(testSecret, time.Now(), click)); code != http.StatusOK {
		t.Errorf("Slack's own click: %d, want 200", code)
	}
	if code := e.send(t, http.MethodGet, AdminPrefix, "198.51.100.2", nil, http.Header{"Authorization": {"Bearer " + testAdminKey}}); code != http.StatusOK {
		t.Errorf("the admin with the right key: %d, want 200", code)
	}
	if got := e.deadLetter(t, dl); got.State != store.DeadLetterRedelivered {
		t.Errorf("dead letter %s after Slack's click, want redelivered", got.State)
	}
}

// Failures from many addresses — each /64 of one /56 of IPv6, 256 clients — spend every
// client's budget of failures together: a failing credential is then answered 429 from any
// address, but no valid one is refused for it: Slack's click and the admin key are served, even
// from an address that failed.
func TestOthersFailuresRefuseNoValidCredential(t *testing.T) {
	t.Parallel()
	e := setup(t) // its clock stands still: nothing refills meanwhile
	tk := e.deliveryDeadTask(t, "t-lockout")
	e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
	dl := "t-lockout:delivery:0:0"
	wrong := http.Header{"Authorization": {"Bearer wrong-key-of-the-right-length"}}
	for i := range 256 {
		e.send(t, http.MethodGet, AdminPrefix, fmt.Sprintf("2001:db8:0:ff%02x::1", i), nil, wrong)
	}
	if code := e.send(t, http.MethodGet, AdminPrefix, "198.51.100.3", nil, wrong); code != http.StatusTooManyRequests {
		t.Errorf("a wrong admin key once every client's failures are spent: %d, want 429", code)
	}
	if code := e.send(t, http.MethodGet, AdminPrefix, "2001:db8:0:ff00::2", nil, http.Header{"Authorization": {"Bearer " + testAdminKey}}); code != http.StatusOK {
		t.Errorf("the admin key from a failing address: %d, want 200", code)
	}
	click := interaction(testApprover, ActionRedeliver, dl)
	if code := e.send(t, http.MethodPost, InteractionsPath, "198.51.100.4", click, SignSlackRequest(testSecret, time.Now(), click)); code != http.StatusOK {
		t.Errorf("Slack's own click: %d, want 200", code)
	}
	if got := e.deadLetter(t, dl); got.State != store.DeadLetterRedelivered {
		t.Errorf("dead letter %s after Slack's click, want redelivered", got.State)
	}
}

// An error the client cannot fix is answered as a bare 500 problem document, without its cause,
// and logged with it.
func TestInternalErrorLogged(t *testing.T) {
	t.Parallel()
	var logged bytes.Buffer
	s := &Service{log: slog.New(slog.NewJSONHandler(&logged, nil))}
	rec := httptest.NewRecorder()
	s.writeError(rec, httptest.NewRequest(http.MethodGet, AdminPrefix, nil), errors.New("firestore: the store caught fire"))
	var p task.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	want := task.Problem{Type: httpapi.ProblemBase + httpapi.TypeInternal, Title: "Internal Server Error", Status: 500, Detail: "internal error"}
	if diff := cmp.Diff(want, p); diff != "" || rec.Code != 500 || rec.Header().Get("Content-Type") != task.ProblemContentType {
		t.Errorf("answered %d %s (-want +got):\n%s", rec.Code, rec.Header().Get("Content-Type"), diff)
	}
	if !strings.Contains(logged.String(), "the store caught fire") || !strings.Contains(logged.String(), `"status":500`) {
		t.Errorf("log %q, want the 500 with its cause", logged.String())
	}
}
