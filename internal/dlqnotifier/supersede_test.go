package dlqnotifier

import (
	"net/http"
	"strings"
	"testing"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A delivery dead letter the task moved past is closed as superseded — after a Regenerate (its
// replay is over) and when a newer event replaces the dead delivery — with its Slack message
// updated: it no longer holds open_dead_letters, so the task gets its TTL once it ends and the
// open-dead-letter count comes back to zero. Before, it stayed open forever and its buttons
// could only answer "moved on".
func TestSupersededDeadLettersClose(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := e.pipeline(t)
	const id = "t-superseded"
	p.recv.Schedule = func(n int) int {
		if n == 1 {
			return http.StatusGone // the task.dead webhook dies
		}
		return http.StatusNoContent
	}
	seen := 0
	e.killBoth(t, p, id, &seen)
	stale := deliveryDL(id, task.EventDead, 0, 0)
	e.approve(t, ActionRegenerate, id+":generation:0:0")
	after := testenv.GetTask(t, e.st, id)
	if len(after.OpenDeadLetters) != 0 {
		t.Fatalf("open dead letters %v after the Regenerate, want none", after.OpenDeadLetters)
	}
	d := e.deadLetter(t, stale)
	if d.State != store.DeadLetterSuperseded || d.DecidedAt == nil {
		t.Fatalf("task.dead's delivery dead letter %+v, want superseded", d)
	}
	var updated bool
	for _, u := range e.slack.Calls("chat.update") {
		if u.Form.Get("ts") == d.SlackTS && strings.Contains(textOf(t, u), "Superseded") && len(buttons(t, u)) == 0 {
			updated = true
		}
	}
	if !updated {
		t.Fatalf("the superseded dead letter's message (ts %s) was not updated without buttons", d.SlackTS)
	}
	e.approve(t, ActionRedeliver, stale) // a click on the old message changes nothing
	if got := e.deadLetter(t, stale); got.State != store.DeadLetterSuperseded {
		t.Fatalf("a click on the superseded dead letter moved it to %s", got.State)
	}

	p.worker.Handle(e.ctx, idMsg(id)) // replay 1 succeeds: task.succeeded replaces the dead delivery
	p.rh.Handle(e.ctx, e.resultNudge(id))
	got := testenv.GetTask(t, e.st, id)
	if got.State != task.StateSucceeded || got.Delivery.State != task.DeliveryDelivered || len(got.OpenDeadLetters) != 0 || got.ExpireAt == nil {
		t.Fatalf("after the rerun: %s delivery %s open %v expire_at %v; want succeeded, delivered, no open dead letter, a TTL",
			got.State, got.Delivery.State, got.OpenDeadLetters, got.ExpireAt)
	}
	open, err := e.st.OpenDeadLetters(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if open[task.StageDelivery] != 0 || open[task.StageGeneration] != 0 {
		t.Fatalf("open dead letters %v, want none", open)
	}
}

// A dead delivery that a newer event replaces outside any decision (a regenerated replay ends
// while the old replay's webhook, still pending at the Regenerate, has since died) is closed by
// the write that replaces it, and its message update is left for the sweeper's slack_update.
func TestDeadDeliveryReplacedByNewerEvent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := e.pipeline(t)
	const id = "t-replaced"
	e.kill(t, p, id)
	seen := 0
	e.deliverNotices(&seen)
	e.approve(t, ActionRegenerate, id+":generation:0:0") // task.dead still pending
	p.recv.Schedule = func(n int) int {
		if n == 1 {
			return http.StatusGone
		}
		return http.StatusNoContent
	}
	p.rh.Handle(e.ctx, e.resultNudge(id)) // task.dead dies during replay 1
	e.deliverNotices(&seen)
	dl := deliveryDL(id, task.EventDead, 0, 1) // it died while the task was on replay 1
	if got := testenv.GetTask(t, e.st, id); len(got.OpenDeadLetters) != 1 || got.OpenDeadLetters[0] != dl {
		t.Fatalf("open dead letters %v, want %s", got.OpenDeadLetters, dl)
	}
	p.worker.Handle(e.ctx, idMsg(id)) // replay 1 succeeds: its task.succeeded replaces the dead delivery
	got := testenv.GetTask(t, e.st, id)
	if got.Delivery.EventType != task.EventSucceeded || len(got.OpenDeadLetters) != 0 || got.SlackUpdate == nil || got.SlackUpdate.Keys[0] != dl {
		t.Fatalf("delivery of %s, open %v, slack update %+v; want task.succeeded, none open, %s's message to update",
			got.Delivery.EventType, got.OpenDeadLetters, got.SlackUpdate, dl)
	}
	if d := e.deadLetter(t, dl); d.State != store.DeadLetterSuperseded {
		t.Fatalf("dead letter %s is %s, want superseded", dl, d.State)
	}
}
