package dlqnotifier

import (
	"net/http"
	"testing"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// deliveryDL is the dead letter id of the round 0 delivery of event typ of task id's replay
// eventReplay, dead while the task was on replay.
func deliveryDL(id string, typ task.EventType, eventReplay, replay int) string {
	return protocol.Notice{Stage: task.StageDelivery, Replay: replay, Event: task.EventID(id, typ, eventReplay)}.DeadLetterID(id)
}

// kill submits task id and runs it into death through the real worker: its task.dead webhook is
// pending.
func (e *env) kill(t *testing.T, p *pipeline, id string) {
	t.Helper()
	e.submit(t, p, id)
	p.gem.FailNext("m", 503, 503)
	p.worker.Handle(e.ctx, idMsg(id))
	if got := testenv.GetTask(t, e.st, id); got.State != task.StateDead {
		t.Fatalf("state %s, want dead", got.State)
	}
}

// killBoth kills task id and lets its task.dead webhook die at the receiver (the caller's
// Schedule answers it 410), then hands both notices to the notifier: two posts.
func (e *env) killBoth(t *testing.T, p *pipeline, id string, seen *int) {
	t.Helper()
	e.kill(t, p, id)
	p.rh.Handle(e.ctx, e.resultNudge(id))
	if got := testenv.GetTask(t, e.st, id); got.State != task.StateDead || got.Delivery.State != task.DeliveryDead || got.Delivery.EventType != task.EventDead {
		t.Fatalf("state %s delivery %s of %s; want dead, its task.dead delivery dead", got.State, got.Delivery.State, got.Delivery.EventType)
	}
	e.deliverNotices(seen)
	if got := testenv.GetTask(t, e.st, id); len(got.OpenDeadLetters) != 2 {
		t.Fatalf("open dead letters %v, want the generation's and the delivery's", got.OpenDeadLetters)
	}
}

// A second delivery that dies in the same replay gets a dead letter and a post of its own: the
// task.dead webhook dies, a Discard queues task.discarded, and that one dies too. Before, both
// were {task}:delivery:0:0 and the second was dropped as already posted — the app never heard of
// the discard and no button could act on it.
func TestSecondDeadDeliveryInOneReplay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := e.pipeline(t)
	const id = "t-two-deaths"
	p.recv.Schedule = func(n int) int {
		if n <= 2 {
			return http.StatusGone // task.dead, then task.discarded: each dies at once
		}
		return http.StatusNoContent
	}
	seen := 0
	e.killBoth(t, p, id, &seen)
	e.approve(t, ActionDiscard, id+":generation:0:0")
	p.rh.Handle(e.ctx, e.resultNudge(id)) // task.discarded: refused, dead
	if got := testenv.GetTask(t, e.st, id); got.Delivery.State != task.DeliveryDead || got.Delivery.EventType != task.EventDiscarded {
		t.Fatalf("delivery %s of %s, want task.discarded dead", got.Delivery.State, got.Delivery.EventType)
	}
	e.deliverNotices(&seen)
	dl := deliveryDL(id, task.EventDiscarded, 0, 0)
	posts := e.slack.Posts()
	if len(posts) != 3 {
		t.Fatalf("%d posts, want 3: the generation, task.dead's delivery, task.discarded's delivery", len(posts))
	}
	if b := buttons(t, posts[2]); len(b) != 2 || b[0][0] != string(ActionRedeliver) || b[0][2] != dl {
		t.Fatalf("buttons of the third post %v, want Redeliver on %s", b, dl)
	}
	if d := e.deadLetter(t, dl); d.State != store.DeadLetterOpen || d.EventType != task.EventDiscarded {
		t.Fatalf("dead letter %+v, want open, of task.discarded", d)
	}
	e.approve(t, ActionRedeliver, dl)
	p.rh.Handle(e.ctx, e.resultNudge(id))
	hooks := p.recv.Hooks()
	last := hooks[len(hooks)-1]
	if last.ID != task.EventID(id, task.EventDiscarded, 0) || last.Status != http.StatusNoContent {
		t.Fatalf("last webhook %s answered %d, want task.discarded delivered", last.ID, last.Status)
	}
}
