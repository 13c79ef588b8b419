package chaos_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// configure sets the process's environment and supervision before its next start.
func (p *proc) configure(env map[string]string, supervised bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.env, p.supervised = env, supervised
}

// The worker is SIGKILLed at each of its crash points in turn — one worker process per point,
// one task in hand at a time (one model-call slot, one message) so the crash cuts exactly one task
// short, never another's paid window — then a fresh worker carries
// every task to its webhook. Only the crashes between the start of a model call and its commit
// (mid_generation, answered) may cost a second generation; nothing else may.
func TestWorkerCrashPoints(t *testing.T) {
	t.Parallel()
	s := newStack(t, geminitest.Fixed(scale(600*time.Millisecond, 2*time.Second)), "")
	s.start(svcPublisher, svcResultHandler, svcDLQNotifier)
	s.submit(scale(8, 40), "crash")
	extra := s.crashAt(scale(1, 3), crashpoint.Points)
	w := s.procs[svcWorker]
	w.configure(s.procEnv("GENBOX_INSTANCE_ID", "fresh"), true)
	w.start(t)
	s.checkInvariants(scale(90*time.Second, 10*time.Minute), extra)
}

// Every model of the chain is down for a while: calls fail, the breakers open, tasks park in
// Firestore (waiting, no attempt burnt, nothing sent to the DLQ) and are released when the chain
// closes. Failed calls are never billed: billed tokens equal what the work needed.
func TestModelOutage(t *testing.T) {
	t.Parallel()
	s := newStack(t, geminitest.Fixed(100*time.Millisecond), "")
	s.start()
	s.fake.Outage("", scale(3*time.Second, time.Minute))
	tasks := s.submit(scale(6, 30), "outage")
	o := s.checkInvariants(scale(90*time.Second, 10*time.Minute), 0)
	parks := 0
	for _, sub := range tasks {
		doc, err := s.store.GetTask(context.Background(), sub.id)
		if err != nil {
			t.Fatal(err)
		}
		parks += doc.Parks
		if len(doc.Notices) != 0 || doc.Attempts >= 5 {
			t.Errorf("task %s: DLQ notices %+v, attempts %d after an outage", sub.id, doc.Notices, doc.Attempts)
		}
	}
	if o.Billed != o.Needed {
		t.Errorf("billed %d tokens for %d needed: an outage's failed calls were billed", o.Billed, o.Needed)
	}
	t.Logf("outage: %d model calls for %d tasks (%d failed during the outage), %d parks, %d Slack posts (alerts)",
		o.ModelCalls, o.Tasks, s.fake.Ledger().Total.Failed, parks, len(s.slack.Calls("chat.postMessage")))
}

// The app's webhook receiver is down (connections refused) for a while: the tasks succeed,
// their deliveries back off in Firestore, and once the receiver is back each event arrives once.
func TestWebhookReceiverDown(t *testing.T) {
	t.Parallel()
	s := newStack(t, geminitest.Fixed(50*time.Millisecond), "")
	s.recv.Stop()
	s.start()
	tasks := s.submit(scale(6, 30), "hookdown")
	// Down until every task has succeeded and seen at least one refused delivery.
	deadline := time.Now().Add(90 * time.Second)
	for _, sub := range tasks {
		for {
			doc, err := s.store.GetTask(context.Background(), sub.id)
			if err != nil {
				t.Fatal(err)
			}
			if doc.State == task.StateSucceeded && doc.Delivery.Attempts > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task %s: state %s, %d delivery attempts while the receiver is down", sub.id, doc.State, doc.Delivery.Attempts)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(scale(time.Second, 30*time.Second)) // the rest of the receiver's outage
	s.recv.Start(t, s.recv.Addr())
	s.checkInvariants(scale(90*time.Second, 10*time.Minute), 0)
}

// The Pub/Sub emulator dies with messages in flight and comes back empty on the same address:
// every nudge published before is gone, the outputs answered meanwhile cannot publish their
// result nudge, and tasks submitted meanwhile were never nudged. Firestore and the sweeper carry
// every task to its webhook, and no generation is paid twice.
func TestPubSubRestartedEmpty(t *testing.T) {
	t.Parallel()
	emulator.Require(t) // this test's own Pub/Sub emulator needs Java too
	port, err := strconv.Atoi(freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	start := func() *emulator.Emulators { return ownPubSub(t, port) }
	emu := start()
	s := newStack(t, geminitest.Fixed(100*time.Millisecond), emu.PubSubHost)
	gate := s.fake.Block("")
	s.start()
	s.logf("services started")
	before := scale(3, 20)
	s.submit(before, "before")
	for i := range before {
		select {
		case <-gate.Entered():
		case <-time.After(60 * time.Second):
			t.Fatalf("only %d of %d generations started", i, before)
		}
	}
	s.logf("%d generations started; killing the Pub/Sub emulator", before)
	emu.Stop()
	gate.Release() // the outputs commit; their result nudges have nowhere to go
	s.submit(scale(3, 20), "during")
	s.logf("submitted while Pub/Sub is down")
	time.Sleep(scale(time.Second, 20*time.Second)) // the rest of the outage
	restarted := start()
	if restarted.PubSubHost != emu.PubSubHost {
		t.Fatalf("restarted on %s, want %s", restarted.PubSubHost, emu.PubSubHost)
	}
	testenv.BusAt(t, s.project, restarted.PubSubHost, topology())
	s.logf("Pub/Sub restarted empty and bootstrapped")
	s.checkInvariants(scale(120*time.Second, 10*time.Minute), 0)
}

// The resulthandler is SIGKILLed right after receivers answered 2xx, before it could record the
// delivery: the one documented window for a duplicate webhook. Each such event is delivered again
// with the same webhook-id once the delivery lease expires — at most one duplicate per kill —
// and nothing else is ever sent twice.
func TestResultHandlerKilledAfterDelivery(t *testing.T) {
	t.Parallel()
	s := newStack(t, geminitest.Fixed(50*time.Millisecond), "")
	kills := scale(2, 10)
	var mu sync.Mutex
	killed := 0
	s.recv.Answered = func(doubles.Hook) {
		mu.Lock()
		defer mu.Unlock()
		if killed < kills {
			killed++
			s.procs[svcResultHandler].kill()
		}
	}
	s.start()
	s.submit(scale(6, 30), "rhkill")
	o := s.checkInvariants(scale(90*time.Second, 10*time.Minute), 0)
	mu.Lock()
	defer mu.Unlock()
	if killed != kills {
		t.Errorf("resulthandler killed %d times, want %d", killed, kills)
	}
	t.Logf("resulthandler killed %d times right after a 2xx (at %v): %d duplicate deliveries, each with the same webhook-id, in the window of a kill",
		killed, s.procs[svcResultHandler].killed(), o.Duplicates)
}
