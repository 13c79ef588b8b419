package dlqnotifier

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A generation-stage notice becomes one dead letter and one Block Kit message with what a human
// needs to decide, and Regenerate/Discard buttons carrying the dead letter id; the notice is
// cleared and the dead letter stays open on the task.
func TestNoticePostsOneMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		make    func(t *testing.T, e *env) *protocol.Task
		dlID    string
		buttons []string
		texts   []string
	}{
		{
			name: "generation", dlID: "t-gen:generation:0:0",
			make: func(t *testing.T, e *env) *protocol.Task {
				t.Helper()
				return e.deadTask(t, "t-gen")
			},
			buttons: []string{"regenerate|Regenerate (~$0.0001)", "discard|Discard"},
			texts:   []string{"`t-gen`", "acme", "summarize/default", "*Stage:* generation", "*Attempts:* 3", "300 tokens", "$0.000600", "transient: model overloaded"},
		},
		{
			name: "delivery", dlID: "t-del:delivery:0:0",
			make: func(t *testing.T, e *env) *protocol.Task {
				t.Helper()
				return e.deliveryDeadTask(t, "t-del")
			},
			buttons: []string{"redeliver|Redeliver (free)", "discard|Discard"},
			texts:   []string{"`t-del`", "classify/default", "*Stage:* delivery", "task.failed", "t-del.task.failed.0", "*Attempts:* 4", "HTTP 410"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			tk := tc.make(t, e)
			if r := e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0])); r != bus.Ack {
				t.Fatalf("result %v", r)
			}
			posts := e.slack.Posts()
			if len(posts) != 1 {
				t.Fatalf("%d posts, want 1", len(posts))
			}
			p := posts[0]
			if p.Form.Get("channel") != testChannel {
				t.Errorf("channel %q", p.Form.Get("channel"))
			}
			var got []string
			for _, b := range buttons(t, p) {
				got = append(got, b[0]+"|"+b[1])
				if b[2] != tc.dlID {
					t.Errorf("button %s value %q, want the dead letter id %q", b[0], b[2], tc.dlID)
				}
			}
			if !slices.Equal(got, tc.buttons) {
				t.Errorf("buttons %v, want %v", got, tc.buttons)
			}
			for _, want := range tc.texts {
				if !strings.Contains(textOf(t, p), want) {
					t.Errorf("message lacks %q:\n%s", want, p.Form.Get("blocks"))
				}
			}
			d := e.deadLetter(t, tc.dlID)
			if d.State != store.DeadLetterOpen || d.SlackChannel != testChannel || d.SlackTS == "" || d.TaskID != tk.ID || d.Tenant != testTenant {
				t.Errorf("dead letter %+v", d)
			}
			after := testenv.GetTask(t, e.st, tk.ID)
			if len(after.Notices) != 0 || !slices.Equal(after.OpenDeadLetters, []string{tc.dlID}) {
				t.Errorf("task notices %+v open %v", after.Notices, after.OpenDeadLetters)
			}
			if after.ExpireAt != nil {
				t.Error("a task with an open dead letter must not expire")
			}
		})
	}
}

// The same notice delivered twice — one after the other, or at once to two instances — is one
// dead letter and one Slack post.
func TestNoticeTwiceOnePost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.deadTask(t, "t-twice")
	msg := noticeMsg(tk.ID, tk.Notices[0])
	e.svc.Handle(e.ctx, msg)
	e.svc.Handle(e.ctx, msg)
	if n := len(e.slack.Posts()); n != 1 {
		t.Fatalf("sequential duplicates: %d posts, want 1", n)
	}

	// While the first post is in flight (held by the double), duplicates on this instance and
	// on another find the notice's lease live and do not post.
	tk2 := e.deadTask(t, "t-twice-concurrent")
	other := New(e.cfg, e.st, NewSlackClient(e.cfg), e.pub, nil, slog.New(slog.DiscardHandler))
	other.cfg.Instance = "dn-2"
	finish := e.handleWhileSlackHolds(t, noticeMsg(tk2.ID, tk2.Notices[0]))
	e.svc.Handle(e.ctx, noticeMsg(tk2.ID, tk2.Notices[0]))
	other.Handle(e.ctx, noticeMsg(tk2.ID, tk2.Notices[0]))
	finish()
	n := 0
	for _, p := range e.slack.Posts() {
		if strings.Contains(textOf(t, p), "t-twice-concurrent") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("duplicates during the post: %d posts, want 1", n)
	}
	if got := testenv.GetTask(t, e.st, tk2.ID); len(got.Notices) != 0 || len(got.OpenDeadLetters) != 1 {
		t.Fatalf("task %+v %v", got.Notices, got.OpenDeadLetters)
	}
}

// Slack answering 500 to the first post releases the notice's lease with a backoff on its
// next_attempt_at; the sweeper re-sends the notice once it is due, and the retry posts: one
// message in the end.
func TestSlack500RetriedBySweeper(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.slack.SetFail(func(method string, n int) bool { return method == "chat.postMessage" && n == 1 })
	tk := e.deadTask(t, "t-500")
	e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
	if n := len(e.slack.Calls("chat.postMessage")); n != 1 {
		t.Fatalf("%d post attempts, want 1", n)
	}
	after := testenv.GetTask(t, e.st, tk.ID)
	if len(after.Notices) != 1 || after.Notices[0].Lease.Live(e.clock.Now()) || after.Notices[0].NextAttemptAt == nil ||
		!after.Notices[0].NextAttemptAt.Equal(e.clock.Now().Add(e.cfg.PostBackoffBase)) {
		t.Fatalf("after a failed post the notice must be released with a backoff: %+v", after.Notices)
	}
	if d := e.deadLetter(t, "t-500:generation:0:0"); d.SlackTS != "" || d.PostAttempts != 1 || d.State != store.DeadLetterOpen {
		t.Fatalf("dead letter %+v", d)
	}

	sw, sweeperPub := e.sweeper()
	if _, err := sw.Pass(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(sweeperPub.On(bus.TopicTasksDLQ)); n != 0 {
		t.Fatalf("the sweeper re-sent the notice before its backoff: %d", n)
	}
	e.clock.Add(e.cfg.PostBackoffBase + time.Second)
	if _, err := sw.Pass(e.ctx); err != nil {
		t.Fatal(err)
	}
	resent := sweeperPub.On(bus.TopicTasksDLQ)
	if len(resent) != 1 || resent[0].Attrs[task.AttrKind] != KindNotice {
		t.Fatalf("sweeper published %+v", resent)
	}
	e.svc.Handle(e.ctx, &bus.Message{ID: "resent", Attributes: resent[0].Attrs})
	if n := len(e.slack.Posts()); n != 1 {
		t.Fatalf("%d accepted posts, want 1", n)
	}
	if n := len(e.slack.Calls("chat.postMessage")); n != 2 {
		t.Fatalf("%d post attempts, want 2", n)
	}
	if got := testenv.GetTask(t, e.st, tk.ID); len(got.Notices) != 0 {
		t.Fatalf("notice not cleared: %+v", got.Notices)
	}
	if d := e.deadLetter(t, "t-500:generation:0:0"); d.SlackTS == "" || d.PostAttempts != 0 {
		t.Fatalf("dead letter %+v", d)
	}
}

// A poison copy (Pub/Sub's own dead-lettering) of a healthy task's message raises an alert and
// records no dead letter; one of a task that really is dead is recorded and posted once.
func TestPoison(t *testing.T) {
	t.Parallel()
	e := setup(t)
	now := e.clock.Now()
	healthy := &protocol.Task{ID: "t-healthy", Tenant: testTenant, Family: "summarize", Input: "x", State: task.StateQueued, CreatedAt: now}
	if err := e.st.CreateTask(e.ctx, healthy); err != nil {
		t.Fatal(err)
	}
	poison := func(id, source string) *bus.Message {
		return &bus.Message{ID: "p-" + id, DeliveryAttempt: 10, Attributes: map[string]string{
			task.AttrTaskID: id, AttrDeadLetterSource: source, "CloudPubSubDeadLetterSourceSubscriptionProject": "p",
		}}
	}
	e.svc.Handle(e.ctx, poison("t-healthy", bus.SubWorker))
	alerts := e.pub.On(bus.TopicAlerts)
	if len(alerts) != 1 || alerts[0].Attrs[task.AttrKind] != KindAlert || alerts[0].Attrs[task.AttrAlert] != "poison:"+bus.SubWorker {
		t.Fatalf("alerts %+v", alerts)
	}
	if _, err := e.st.GetDeadLetter(e.ctx, "t-healthy:generation:0:0"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a healthy task got a dead letter: %v", err)
	}
	if len(e.slack.Posts()) != 0 {
		t.Fatal("posted for a healthy task")
	}

	// A dead task whose notice was already handled: nothing new.
	dead := e.deadTask(t, "t-dead")
	e.svc.Handle(e.ctx, noticeMsg(dead.ID, dead.Notices[0]))
	e.svc.Handle(e.ctx, poison("t-dead", "projects/p/subscriptions/"+bus.SubWorker))
	if n := len(e.slack.Posts()); n != 1 {
		t.Fatalf("%d posts, want 1", n)
	}
	// A dead delivery whose notice was lost: the poison copy records and posts it.
	del := e.deliveryDeadTask(t, "t-lost")
	if _, err := e.st.MutateTask(e.ctx, del.ID, func(t *protocol.Task, _ time.Time) error { t.Notices = nil; return nil }); err != nil {
		t.Fatal(err)
	}
	e.svc.Handle(e.ctx, poison("t-lost", bus.SubResults))
	if n := len(e.slack.Posts()); n != 2 {
		t.Fatalf("%d posts, want 2", n)
	}
	if d := e.deadLetter(t, "t-lost:delivery:0:0:task.failed.0"); d.State != store.DeadLetterOpen || d.SlackTS == "" {
		t.Fatalf("dead letter %+v", d)
	}
	if n := len(e.pub.On(bus.TopicAlerts)); n != 1 {
		t.Fatalf("%d alerts, want only the healthy task's", n)
	}
}

// An alert repeated within its cooldown is posted once, across instances; another key is posted;
// after the cooldown the key is posted again; a failed post does not hold the key back.
func TestAlertCooldown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	alert := func(key string) *bus.Message {
		return &bus.Message{ID: "a", Data: []byte("breaker open on m"), Attributes: map[string]string{task.AttrKind: KindAlert, task.AttrAlert: key}}
	}
	other := New(e.cfg, e.st, NewSlackClient(e.cfg), e.pub, nil, slog.New(slog.DiscardHandler))
	var wg sync.WaitGroup
	for _, s := range []*Service{e.svc, other, e.svc, other} {
		wg.Add(1)
		go func() { defer wg.Done(); s.Handle(e.ctx, alert("breaker:m")) }()
	}
	wg.Wait()
	if n := len(e.slack.Posts()); n != 1 {
		t.Fatalf("%d posts within the cooldown, want 1", n)
	}
	if !strings.Contains(e.slack.Posts()[0].Form.Get("text"), "breaker open on m") {
		t.Fatalf("text %q", e.slack.Posts()[0].Form.Get("text"))
	}
	e.svc.Handle(e.ctx, alert("oldest-pending"))
	if n := len(e.slack.Posts()); n != 2 {
		t.Fatalf("another key: %d posts, want 2", n)
	}
	e.clock.Add(e.cfg.AlertCooldown)
	e.svc.Handle(e.ctx, alert("breaker:m"))
	if n := len(e.slack.Posts()); n != 3 {
		t.Fatalf("after the cooldown: %d posts, want 3", n)
	}

	e.slack.SetFail(func(method string, n int) bool { return method == "chat.postMessage" && n == 4 })
	e.svc.Handle(e.ctx, alert("failure-rate"))
	e.svc.Handle(e.ctx, alert("failure-rate"))
	if n := len(e.slack.Calls("chat.postMessage")); n != 5 {
		t.Fatalf("a failed alert post must not hold its key back: %d calls, want 5", n)
	}
}

// A decision taken while the dead letter's post is in flight (before its channel/ts is stored)
// still reaches the message: the post's commit sees the decision and updates the message at once.
func TestDecidedWhilePosting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.deliveryDeadTask(t, "t-race")
	finish := e.handleWhileSlackHolds(t, noticeMsg(tk.ID, tk.Notices[0]))
	e.approve(t, ActionDiscard, "t-race:delivery:0:0")
	if n := len(e.slack.Calls("chat.update")); n != 0 {
		t.Fatalf("updated a message whose ts is not known yet: %d", n)
	}
	finish()
	u := e.slack.Calls("chat.update")
	if len(u) != 1 || !strings.Contains(textOf(t, u[0]), "Discarded* by <@"+testApprover+">") || len(buttons(t, u[0])) != 0 {
		t.Fatalf("chat.update %+v", u)
	}
	if got := testenv.GetTask(t, e.st, tk.ID); got.SlackUpdate != nil || len(got.Notices) != 0 {
		t.Fatalf("left behind: %+v %+v", got.SlackUpdate, got.Notices)
	}
}

// One instance never posts a dead letter twice at once. A notice that reaches the instance already
// posting it — here re-sent after the post lease lapsed while Slack was slow to answer — is acked
// without a transaction, where one would take the lapsed lease and post a second message.
func TestDuplicateNoticeInTheSameInstanceAcked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.deadTask(t, "t-dup")
	finish := e.handleWhileSlackHolds(t, noticeMsg(tk.ID, tk.Notices[0]))
	e.clock.Add(e.cfg.PostLease + time.Second) // the post lease lapses while Slack has not answered
	dup := make(chan bus.Result, 1)
	go func() { dup <- e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0])) }()
	select {
	case r := <-dup:
		if r != bus.Ack {
			t.Fatalf("duplicate: %v, want ack", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the duplicate notice was not acked")
	}
	if r := finish(); r != bus.Ack {
		t.Fatalf("first: %v", r)
	}
	if n := len(e.slack.Calls("chat.postMessage")); n != 1 {
		t.Fatalf("%d chat.postMessage calls, want 1", n)
	}
	if d := e.deadLetter(t, "t-dup:generation:0:0"); d.SlackTS == "" {
		t.Fatalf("dead letter not recorded as posted: %+v", d)
	}
}
