package dlqnotifier

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// TestDeliveryFloodIsOneMessage kills 50 deliveries of one tenant whose receiver answers 404 to
// everything: Slack gets the first on its own, with its buttons, and one more message, updated
// with the count, for the 49 others — not 50 pages. Every dead letter stays open and the tenant
// sees why on the task; a generation dead letter meanwhile still gets its own message with its
// buttons.
func TestDeliveryFloodIsOneMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 50
	for i := range n {
		id := fmt.Sprintf("t-flood-%02d", i)
		now := e.clock.Now()
		tk := e.refusedDelivery(t, id, 404)
		e.svc.Handle(e.ctx, noticeMsg(id, tk.Notices[0]))
		e.clock.Set(now.Add(time.Second))
	}
	gen := e.deadTask(t, "t-generation")
	e.svc.Handle(e.ctx, noticeMsg(gen.ID, gen.Notices[0]))

	posts := e.slack.Posts()
	if len(posts) != 3 {
		t.Fatalf("%d Slack posts, want 3: the flood's first dead letter, the flood's message, the generation", len(posts))
	}
	if b := buttons(t, posts[0]); len(b) != 2 || b[0][0] != string(ActionRedeliver) {
		t.Errorf("the flood's first dead letter has buttons %v, want Redeliver and Discard", b)
	}
	updates := e.slack.Calls("chat.update")
	if len(updates) == 0 {
		t.Fatal("the flood's message was never updated with its count")
	}
	last := updates[len(updates)-1]
	if last.Form.Get("ts") == posts[0].Form.Get("ts") || !strings.Contains(textOf(t, last), fmt.Sprintf("*%d more webhook deliveries of tenant `%s`", n-1, testTenant)) ||
		!strings.Contains(textOf(t, last), "HTTP 404") {
		t.Errorf("the flood's message, last updated, reads:\n%s\nwant the count %d, the tenant and the cause", textOf(t, last), n-1)
	}
	if b := buttons(t, posts[2]); len(b) != 2 || b[0][0] != string(ActionRegenerate) || !strings.Contains(textOf(t, posts[2]), gen.ID) {
		t.Errorf("the generation dead letter's message has buttons %v:\n%s\nwant its own, with Regenerate and Discard", b, textOf(t, posts[2]))
	}
	for i := range n {
		id := fmt.Sprintf("t-flood-%02d", i)
		tk := testenv.GetTask(t, e.st, id)
		if len(tk.Notices) != 0 || len(tk.OpenDeadLetters) != 1 {
			t.Fatalf("task %s: notices %+v, open dead letters %v; want its dead letter recorded, open, its notice cleared", id, tk.Notices, tk.OpenDeadLetters)
		}
		if v := tk.View().Delivery; v.State != task.DeliveryDead || v.LastStatus != 404 || v.LastError == "" {
			t.Fatalf("task %s as the tenant sees it: delivery %+v, want dead with status 404 and its error", id, v)
		}
	}
}

// TestFloodJoinedWhilePostingIsShown holds the flood's message in Slack while more dead letters
// join (they find its post claimed and leave it to the holder): once Slack answers, the holder
// updates the message to the whole count, so none of them goes unshown.
func TestFloodJoinedWhilePostingIsShown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 6
	var msgs []*bus.Message
	for i := range n {
		tk := e.refusedDelivery(t, fmt.Sprintf("t-burst-%02d", i), 404)
		msgs = append(msgs, noticeMsg(tk.ID, tk.Notices[0]))
	}
	e.svc.Handle(e.ctx, msgs[0])                  // the first, on its own
	finish := e.handleWhileSlackHolds(t, msgs[1]) // posts the flood's message
	for _, m := range msgs[2:] {
		e.svc.Handle(e.ctx, m)
	}
	finish()
	if posts := e.slack.Posts(); len(posts) != 2 {
		t.Fatalf("%d Slack posts, want 2: the flood's first dead letter and the flood's message", len(posts))
	}
	ups := e.slack.Calls("chat.update")
	if len(ups) != 1 {
		t.Fatalf("%d updates of the flood's message, want 1 after its post for the %d that joined meanwhile", len(ups), n-2)
	}
	if want := fmt.Sprintf("*%d more webhook deliveries", n-1); !strings.Contains(textOf(t, ups[0]), want) {
		t.Errorf("the flood's message reads:\n%s\nwant %q", textOf(t, ups[0]), want)
	}
	if f := e.flood(t, "http-404"); f.Count != n-1 || f.Shown != n-1 || f.PostUntil != nil {
		t.Errorf("flood counts %d, shows %d, post claim until %v; want %d, %d and no claim", f.Count, f.Shown, f.PostUntil, n-1, n-1)
	}
}

// refusedDelivery writes a succeeded task whose task.succeeded webhook the receiver refused with
// status at its first attempt, with its DLQ notice.
func (e *env) refusedDelivery(t testing.TB, id string, status int) *protocol.Task {
	t.Helper()
	now := e.clock.Now()
	tk := &protocol.Task{ID: id, Tenant: testTenant, Family: "classify", Variant: "default", Input: "x",
		CallbackURL: "https://app.example/hook", State: task.StateRunning, CreatedAt: now}
	tk.Output, tk.OutputAt = "ok", &now
	tk.Finish(task.StateSucceeded, now)
	tk.Delivery.State, tk.Delivery.Attempts, tk.Delivery.NextAttemptAt = task.DeliveryDead, 1, nil
	tk.Delivery.LastStatus, tk.Delivery.LastError = status, fmt.Sprintf("receiver refused: %d %s", status, http.StatusText(status))
	next := now.Add(time.Minute)
	tk.Notices = append(tk.Notices, protocol.Notice{Stage: task.StageDelivery, Event: tk.Delivery.EventID, NextAttemptAt: &next})
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
	return tk
}

// flood reads the test tenant's flood of cause.
func (e *env) flood(t testing.TB, cause string) store.Flood {
	t.Helper()
	snap, err := e.fs.Collection(store.FloodsCollection).Doc(store.FloodKey(testTenant, cause)).Get(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var f store.Flood
	if err := snap.DataTo(&f); err != nil {
		t.Fatal(err)
	}
	return f
}
