package dlqnotifier

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/internal/worker"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// pipeline is the real worker (on the fake Gemini) and resulthandler (to a real receiver) around
// the env's store, publishing on the env's recording publisher.
type pipeline struct {
	gem    *geminitest.Server
	worker *worker.Handler
	rh     *resulthandler.Handler
	recv   *doubles.Receiver
}

func (e *env) pipeline(t *testing.T) *pipeline {
	t.Helper()
	gem := geminitest.NewServer()
	t.Cleanup(gem.Close)
	vars := map[string]string{
		"GOOGLE_GEMINI_BASE_URL": gem.URL, "GENBOX_MODEL_CHAIN": "m",
		"GENBOX_MAX_ATTEMPTS": "2", "GENBOX_MODEL_ATTEMPTS": "2",
		"GENBOX_BACKOFF_BASE": "5ms", "GENBOX_BACKOFF_MAX": "10ms",
	}
	gcfg, err := geminienv.Config(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	gen, err := gemini.New(e.ctx, gcfg)
	if err != nil {
		t.Fatal(err)
	}
	recv := doubles.NewReceiver(t, testenv.Tenant(t, e.st, testTenant))
	quiet := slog.New(slog.DiscardHandler)
	render := fakeRenderer{RenderFunc: func(family, variant, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{Family: family, Variant: variant, Prompt: input, Models: []string{"m"}}, nil
	}}
	w := worker.New(e.st, gen, render, e.pub, quiet, worker.Policy{
		Owner: "w-1", LeaseTTL: 5 * time.Second, RenewEvery: time.Second, MaxAttempts: 1, ClaimCap: 2,
		RetryBase: time.Second, RetryMax: 2 * time.Second, ParkBase: time.Second, ParkMax: 2 * time.Second,
		NudgeGrace: time.Minute, CommitRetry: 5 * time.Second, DeliveryLease: protocol.DeliveryLease(2 * time.Second),
	})
	pol := resulthandler.Policy{Owner: "rh-1", Timeout: 2 * time.Second, Horizon: time.Hour,
		BackoffMin: time.Second, BackoffMax: 10 * time.Second, NoticeGrace: time.Minute, LogEntries: 20}
	rh, err := resulthandler.New(e.st, e.st, e.pub, ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true, Timeout: pol.Timeout}), quiet, pol)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeline{gem: gem, worker: w, rh: rh, recv: recv}
}

// submit writes a queued task calling back the receiver.
func (e *env) submit(t *testing.T, p *pipeline, id string) {
	t.Helper()
	tk := &protocol.Task{ID: id, Tenant: testTenant, Family: "summarize", Variant: "default", Input: "summarize " + id,
		State: task.StateQueued, CallbackURL: p.recv.URL()}
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
}

func idMsg(id string) *bus.Message {
	return &bus.Message{ID: "m-" + id, Attributes: map[string]string{task.AttrTaskID: id}}
}

// resultNudge is the latest gemini-results nudge published for task id, as the resulthandler
// receives it: the worker's names the delivery its commit reserved for it.
func (e *env) resultNudge(id string) *bus.Message {
	msgs := e.pub.On(bus.TopicResults)
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Attrs[task.AttrTaskID] == id {
			return &bus.Message{ID: "m-" + id, Attributes: msgs[i].Attrs}
		}
	}
	return idMsg(id)
}

// deliverNotices hands every DLQ notice published since *seen to the notifier.
func (e *env) deliverNotices(seen *int) {
	var all []testenv.Published
	all = append(all, e.pub.On(bus.TopicTasksDLQ)...)
	all = append(all, e.pub.On(bus.TopicResultsDLQ)...)
	for _, m := range all[*seen:] {
		e.svc.Handle(e.ctx, &bus.Message{ID: "n", Attributes: m.Attrs})
	}
	*seen = len(all)
}

// nudged reports how many nudges of task id were published on topic.
func (e *env) nudged(topic, id string) int {
	n := 0
	for _, m := range e.pub.On(topic) {
		if m.Attrs[task.AttrTaskID] == id && m.Attrs[task.AttrKind] == "" {
			n++
		}
	}
	return n
}

// An approver clicks Regenerate on a generation that died: the task runs again (one more bill on
// the fake's ledger) and succeeds, and its task.succeeded webhook has a new webhook-id; the
// message is updated with who decided. Dead again after the Regenerate, it is a second, separate
// post; a second Regenerate succeeds with yet another webhook-id.
func TestRegenerate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := e.pipeline(t)
	const id = "t-regen"
	e.submit(t, p, id)
	p.gem.FailNext("m", 503, 503)
	p.worker.Handle(e.ctx, idMsg(id))
	if got := testenv.GetTask(t, e.st, id); got.State != task.StateDead {
		t.Fatalf("state %s, want dead", got.State)
	}
	seen := 0
	e.deliverNotices(&seen)
	posts := e.slack.Posts()
	if len(posts) != 1 {
		t.Fatalf("%d posts, want 1", len(posts))
	}
	dl := id + ":generation:0:0"
	if b := buttons(t, posts[0]); len(b) != 2 || b[0][0] != string(ActionRegenerate) || b[0][2] != dl {
		t.Fatalf("buttons %v", b)
	}
	p.rh.Handle(e.ctx, e.resultNudge(id)) // the task.dead webhook
	bills := len(p.gem.Ledger().Bills)

	e.approve(t, ActionRegenerate, dl)
	if n := len(p.gem.Ledger().Bills); n != bills {
		t.Fatalf("the Regenerate decision billed %d generations; it only queues one", n-bills)
	}
	after := testenv.GetTask(t, e.st, id)
	if after.State != task.StateQueued || after.Replay != 1 || after.Attempts != 0 || after.Claims != 0 || !after.BypassCache ||
		len(after.Previous) != 1 || after.Previous[0].State != task.StateDead || after.Error != nil || len(after.OpenDeadLetters) != 0 {
		t.Fatalf("after Regenerate: %+v", after)
	}
	if after.Decision == nil || len(after.Decision.Topics) != 0 || after.SlackUpdate != nil {
		t.Fatalf("decision follow-up not carried: %+v %+v", after.Decision, after.SlackUpdate)
	}
	if e.nudged(bus.TopicTasks, id) != 1 {
		t.Fatalf("gemini-tasks nudges %d, want 1", e.nudged(bus.TopicTasks, id))
	}
	d := e.deadLetter(t, dl)
	if d.State != store.DeadLetterRegenerated || d.DecidedBy != "<@"+testApprover+">" || d.DecidedAt == nil || !d.Applied {
		t.Fatalf("dead letter %+v", d)
	}
	updates := e.slack.Calls("chat.update")
	if len(updates) != 1 || updates[0].Form.Get("ts") != d.SlackTS || updates[0].Form.Get("channel") != testChannel ||
		!strings.Contains(textOf(t, updates[0]), "Regenerated* by <@"+testApprover+">") || len(buttons(t, updates[0])) != 0 {
		t.Fatalf("chat.update %+v", updates)
	}

	// Regenerated, then dead again: a second, separate post, and a second Regenerate.
	p.gem.FailNext("m", 503, 503)
	p.worker.Handle(e.ctx, idMsg(id))
	if got := testenv.GetTask(t, e.st, id); got.State != task.StateDead || got.Replay != 1 {
		t.Fatalf("after the failed rerun: %s replay %d", got.State, got.Replay)
	}
	e.deliverNotices(&seen)
	posts = e.slack.Posts()
	if len(posts) != 2 || buttons(t, posts[1])[0][2] != id+":generation:1:0" {
		t.Fatalf("dead again: %d posts, want a second one for replay 1", len(posts))
	}
	e.approve(t, ActionRegenerate, id+":generation:1:0")
	bills = len(p.gem.Ledger().Bills)
	p.worker.Handle(e.ctx, idMsg(id))
	if got := testenv.GetTask(t, e.st, id); got.State != task.StateSucceeded || got.Replay != 2 || len(got.Previous) != 2 {
		t.Fatalf("after the rerun: %s replay %d", got.State, got.Replay)
	}
	if n := len(p.gem.Ledger().Bills); n != bills+1 {
		t.Fatalf("ledger %d bills, want %d (one generation)", n, bills+1)
	}
	p.rh.Handle(e.ctx, e.resultNudge(id))
	var ids []string
	for _, h := range p.recv.Hooks() {
		if h.VerifyErr != nil {
			t.Fatalf("unverified webhook %+v", h)
		}
		ids = append(ids, h.ID)
	}
	want := []string{task.EventID(id, task.EventDead, 0), task.EventID(id, task.EventDead, 1), task.EventID(id, task.EventSucceeded, 2)}
	if !slices.Equal(ids, want) {
		t.Fatalf("webhook ids %v, want %v (a new one for the regenerated success)", ids, want)
	}
	if n := len(e.slack.Calls("chat.update")); n != 2 {
		t.Fatalf("%d chat.update, want one per decision", n)
	}
}

// Redeliver on a dead task.failed delivery: the same event is delivered again with the same
// webhook-id and payload, without a model call (the fake's ledger is unchanged, no gemini-tasks
// nudge). Redelivered and dead again, it is a second, separate post.
func TestRedeliver(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := e.pipeline(t)
	const id = "t-redeliver"
	e.submit(t, p, id)
	p.gem.FailNext("m", 400) // a permanent refusal: task.failed
	p.worker.Handle(e.ctx, idMsg(id))
	if got := testenv.GetTask(t, e.st, id); got.State != task.StateFailed || got.Delivery.EventType != task.EventFailed {
		t.Fatalf("state %s event %s", got.State, got.Delivery.EventType)
	}
	p.recv.Schedule = func(n int) int {
		if n <= 2 {
			return http.StatusGone // refused: the delivery dies at once
		}
		return http.StatusNoContent
	}
	p.rh.Handle(e.ctx, e.resultNudge(id))
	if got := testenv.GetTask(t, e.st, id); got.Delivery.State != task.DeliveryDead {
		t.Fatalf("delivery %s, want dead", got.Delivery.State)
	}
	seen := 0
	e.deliverNotices(&seen)
	failed := task.EventID(id, task.EventFailed, 0)
	dl := protocol.Notice{Stage: task.StageDelivery, Event: failed}.DeadLetterID(id)
	if posts := e.slack.Posts(); len(posts) != 1 || buttons(t, posts[0])[0][0] != string(ActionRedeliver) {
		t.Fatalf("posts %+v", posts)
	}
	ledger := p.gem.Ledger()
	results, tasks := e.nudged(bus.TopicResults, id), e.nudged(bus.TopicTasks, id)

	e.approve(t, ActionRedeliver, dl)
	after := testenv.GetTask(t, e.st, id)
	if d := after.Delivery; d.State != task.DeliveryPending || d.Round != 1 || d.Attempts != 0 || d.FirstAttemptAt != nil || after.State != task.StateFailed {
		t.Fatalf("after Redeliver: task %s delivery %+v", after.State, d)
	}
	if r, k := e.nudged(bus.TopicResults, id)-results, e.nudged(bus.TopicTasks, id)-tasks; r != 1 || k != 0 {
		t.Fatalf("nudges by the Redeliver: results %d tasks %d, want 1 and 0", r, k)
	}
	p.rh.Handle(e.ctx, e.resultNudge(id)) // round 1: refused again → dead again
	e.deliverNotices(&seen)
	posts := e.slack.Posts()
	dl1 := protocol.Notice{Stage: task.StageDelivery, Round: 1, Event: failed}.DeadLetterID(id)
	if len(posts) != 2 || buttons(t, posts[1])[0][2] != dl1 {
		t.Fatalf("dead again: %d posts, want a second one for round 1", len(posts))
	}
	e.approve(t, ActionRedeliver, dl1)
	p.rh.Handle(e.ctx, e.resultNudge(id))

	hooks := p.recv.Hooks()
	if len(hooks) != 3 {
		t.Fatalf("%d webhooks, want 3", len(hooks))
	}
	for _, h := range hooks {
		if h.ID != task.EventID(id, task.EventFailed, 0) || h.Body != hooks[0].Body || h.VerifyErr != nil {
			t.Fatalf("webhook %+v differs from the first %+v", h, hooks[0])
		}
	}
	if got := testenv.GetTask(t, e.st, id); got.Delivery.State != task.DeliveryDelivered || got.Delivery.Round != 2 {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	if got := p.gem.Ledger(); len(got.Bills) != len(ledger.Bills) || got.Total != ledger.Total {
		t.Fatalf("a Redeliver called the model: ledger %+v, was %+v", got.Total, ledger.Total)
	}
	if n := len(e.slack.Calls("chat.update")); n != 2 {
		t.Fatalf("%d chat.update, want one per decision", n)
	}
}

// Discard: a dead generation becomes discarded with a task.discarded webhook; a dead delivery is
// discarded without a new webhook.
func TestDiscard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	gen := e.deadTask(t, "t-discard-gen", func(tk *protocol.Task) { tk.CallbackURL = "https://app.example/hook" })
	del := e.deliveryDeadTask(t, "t-discard-del")
	for _, tk := range []*protocol.Task{gen, del} {
		e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
	}
	// The task.dead event of gen is still pending: the discard event queues behind it.
	e.approve(t, ActionDiscard, "t-discard-gen:generation:0:0")
	g := testenv.GetTask(t, e.st, gen.ID)
	if g.State != task.StateDiscarded || len(g.Delivery.Queue) != 1 || g.Delivery.Queue[0].EventID != task.EventID(gen.ID, task.EventDiscarded, 0) {
		t.Fatalf("generation discard: %s queue %+v", g.State, g.Delivery.Queue)
	}
	e.approve(t, ActionDiscard, "t-discard-del:delivery:0:0")
	d := testenv.GetTask(t, e.st, del.ID)
	if d.State != task.StateFailed || d.Delivery.State != task.DeliveryDiscarded || len(d.Delivery.Queue) != 0 || e.nudged(bus.TopicResults, del.ID) != 0 {
		t.Fatalf("delivery discard: %s %+v", d.State, d.Delivery)
	}
	if d.DueAt != nil || d.ExpireAt == nil || len(d.OpenDeadLetters) != 0 {
		t.Fatalf("a discarded delivery leaves nothing pending: due %v expire %v open %v", d.DueAt, d.ExpireAt, d.OpenDeadLetters)
	}
}

// The decision is recorded before its follow-ups: when the nudge cannot be published, the task
// keeps the decision's topics and the Slack update for the sweeper, and a later slack_update
// nudge finishes both.
func TestDecisionFinishedLater(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.deliveryDeadTask(t, "t-later")
	e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
	e.pub.SetPublishFunc(func(context.Context, string, []byte, map[string]string) error { return context.DeadlineExceeded })
	e.slack.SetFail(func(method string, _ int) bool { return method == "chat.update" })
	e.approve(t, ActionRedeliver, "t-later:delivery:0:0")
	got := testenv.GetTask(t, e.st, tk.ID)
	if got.Decision == nil || len(got.Decision.Topics) != 1 || got.Decision.Topics[0] != bus.TopicResults ||
		got.SlackUpdate == nil || len(got.SlackUpdate.Keys) != 1 || got.DueAt == nil {
		t.Fatalf("pending follow-ups %+v %+v due %v", got.Decision, got.SlackUpdate, got.DueAt)
	}
	if d := e.deadLetter(t, "t-later:delivery:0:0"); d.State != store.DeadLetterRedelivered || d.Applied {
		t.Fatalf("dead letter %+v", d)
	}

	e.pub.SetPublishFunc(nil)
	e.slack.SetFail(nil)
	e.svc.Handle(e.ctx, &bus.Message{ID: "u", Attributes: map[string]string{task.AttrTaskID: tk.ID, task.AttrKind: KindSlackUpdate}})
	got = testenv.GetTask(t, e.st, tk.ID)
	if len(got.Decision.Topics) != 0 || got.SlackUpdate != nil || e.nudged(bus.TopicResults, tk.ID) != 1 {
		t.Fatalf("follow-ups not finished: %+v %+v", got.Decision, got.SlackUpdate)
	}
	if d := e.deadLetter(t, "t-later:delivery:0:0"); !d.Applied {
		t.Fatal("dead letter not marked applied")
	}
	if n := len(e.slack.Calls("chat.update")); n != 2 {
		t.Fatalf("%d chat.update calls, want the failed one and its retry", n)
	}
}

// Two decisions on one task before either's nudges are published: the second keeps the first's
// topics, so the sweeper still publishes both.
func TestDecisionsKeepUnpublishedTopics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.deadTask(t, "t-both", func(tk *protocol.Task) { tk.CallbackURL = "https://app.example/hook" })
	if _, err := e.st.MutateTask(e.ctx, tk.ID, func(t *protocol.Task, now time.Time) error {
		t.Delivery.State, t.Delivery.NextAttemptAt = task.DeliveryDead, nil // the task.dead webhook died too
		t.Notices = append(t.Notices, protocol.Notice{Stage: task.StageDelivery})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := testenv.GetTask(t, e.st, tk.ID)
	for _, n := range got.Notices {
		e.svc.Handle(e.ctx, noticeMsg(tk.ID, n))
	}
	if got := testenv.GetTask(t, e.st, tk.ID); len(got.OpenDeadLetters) != 2 {
		t.Fatalf("open %v", got.OpenDeadLetters)
	}
	e.pub.SetPublishFunc(func(context.Context, string, []byte, map[string]string) error { return context.DeadlineExceeded })
	e.approve(t, ActionRedeliver, "t-both:delivery:0:0")
	e.approve(t, ActionRegenerate, "t-both:generation:0:0")
	got = testenv.GetTask(t, e.st, tk.ID)
	if got.Decision == nil || !slices.Equal(got.Decision.Topics, []string{bus.TopicTasks, bus.TopicResults}) || len(got.OpenDeadLetters) != 0 {
		t.Fatalf("decision %+v open %v", got.Decision, got.OpenDeadLetters)
	}
	e.pub.SetPublishFunc(nil)
	e.svc.Handle(e.ctx, &bus.Message{ID: "u", Attributes: map[string]string{task.AttrTaskID: tk.ID, task.AttrKind: KindSlackUpdate}})
	if e.nudged(bus.TopicTasks, tk.ID) != 1 || e.nudged(bus.TopicResults, tk.ID) != 1 {
		t.Fatalf("nudges tasks %d results %d", e.nudged(bus.TopicTasks, tk.ID), e.nudged(bus.TopicResults, tk.ID))
	}
	if got := testenv.GetTask(t, e.st, tk.ID); len(got.Decision.Topics) != 0 || got.SlackUpdate != nil {
		t.Fatalf("left %+v %+v", got.Decision, got.SlackUpdate)
	}
}

// A decision publishes its own nudge: the sweeper leaves the task alone for the decision grace,
// through the decision's own bookkeeping writes, so it does not send a second claim racing the
// first. A nudge that was lost (nobody claimed the task) is still carried by the sweeper after it.
func TestDecisionHoldsTheSweeperOffItsOwnNudge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.deadTask(t, "t-hold")
	e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
	e.approve(t, ActionRegenerate, "t-hold:generation:0:0")
	got := testenv.GetTask(t, e.st, tk.ID)
	if got.State != task.StateQueued || len(got.Decision.Topics) != 0 || got.SlackUpdate != nil || e.nudged(bus.TopicTasks, tk.ID) != 1 {
		t.Fatalf("after Regenerate: state %s decision %+v slack update %+v, %d nudges", got.State, got.Decision, got.SlackUpdate, e.nudged(bus.TopicTasks, tk.ID))
	}
	sw, sweeperPub := e.sweeper()
	if _, err := sw.Pass(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(sweeperPub.On(bus.TopicTasks)); n != 0 {
		t.Fatalf("the sweeper nudged the task %d times within the decision grace", n)
	}
	e.clock.Add(e.cfg.FollowUpGrace)
	if _, err := sw.Pass(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(sweeperPub.On(bus.TopicTasks)); n != 1 {
		t.Fatalf("the sweeper nudged the unclaimed task %d times after the grace, want 1", n)
	}
}
