package dlqnotifier

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/store"
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
		tk := &store.Task{ID: id, Tenant: testTenant, Family: "classify", Variant: "default", Input: "x",
			CallbackURL: "https://app.example/hook", State: task.StateRunning, CreatedAt: now}
		tk.Output, tk.OutputAt = "ok", &now
		tk.Finish(task.StateSucceeded, now)
		tk.Delivery.State, tk.Delivery.Attempts, tk.Delivery.NextAttemptAt = task.DeliveryDead, 1, nil
		tk.Delivery.LastStatus, tk.Delivery.LastError = 404, "receiver refused: 404 Not Found"
		next := now.Add(time.Minute)
		tk.Notices = append(tk.Notices, store.Notice{Stage: task.StageDelivery, Event: tk.Delivery.EventID, NextAttemptAt: &next})
		if err := e.st.CreateTask(e.ctx, tk); err != nil {
			t.Fatal(err)
		}
		e.svc.Handle(e.ctx, noticeMsg(id, tk.Notices[0]))
		e.clock.Set(now.Add(time.Second))
	}
	gen := e.deadTask(t, "t-generation")
	e.svc.Handle(e.ctx, noticeMsg(gen.ID, gen.Notices[0]))

	posts := e.slack.posts(t)
	if len(posts) != 3 {
		t.Fatalf("%d Slack posts, want 3: the flood's first dead letter, the flood's message, the generation", len(posts))
	}
	if b := buttons(t, posts[0]); len(b) != 2 || b[0][0] != string(ActionRedeliver) {
		t.Errorf("the flood's first dead letter has buttons %v, want Redeliver and Discard", b)
	}
	updates := e.slack.calls("chat.update")
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
		tk := e.get(t, id)
		if len(tk.Notices) != 0 || len(tk.OpenDeadLetters) != 1 {
			t.Fatalf("task %s: notices %+v, open dead letters %v; want its dead letter recorded, open, its notice cleared", id, tk.Notices, tk.OpenDeadLetters)
		}
		if v := tk.View().Delivery; v.State != task.DeliveryDead || v.LastStatus != 404 || v.LastError == "" {
			t.Fatalf("task %s as the tenant sees it: delivery %+v, want dead with status 404 and its error", id, v)
		}
	}
}
