package sweeper

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

func testConfig() Config {
	return Config{Interval: 50 * time.Millisecond, Limit: 100, Pace: 1000, ReleaseRate: 1000,
		LeaderTTL: time.Second, BackoffBase: time.Minute, BackoffMax: 10 * time.Minute}
}

func setup(t *testing.T) (*store.Store, *testenv.Publisher) {
	t.Helper()
	return store.New(testenv.Firestore(t, emulator.ProjectID(t))), &testenv.Publisher{}
}

// storeClock makes s's clock a settable one, starting now.
func storeClock(s *store.Store) (advance func(time.Duration)) {
	var mu sync.Mutex
	clock := time.Now().UTC().Truncate(time.Millisecond) // Firestore keeps microseconds
	s.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	return func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
}

func create(t *testing.T, s *store.Store, id string, mutate func(*protocol.Task)) {
	t.Helper()
	doc := &protocol.Task{ID: id, Tenant: "a", Family: "f", Input: "x", State: task.StateQueued}
	mutate(doc)
	if err := s.CreateTask(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
}

func TestPassNudgesWhatIsDue(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	now := time.Now().UTC()
	past, future := now.Add(-time.Minute), now.Add(time.Hour)
	create(t, s, "queued", func(*protocol.Task) {})
	create(t, s, "backoff", func(d *protocol.Task) { d.NotBefore = &future })
	create(t, s, "running-live", func(d *protocol.Task) {
		d.State, d.Lease = task.StateRunning, claim.Lease{Owner: "w", Epoch: 1, ExpiresAt: &future}
	})
	create(t, s, "running-expired", func(d *protocol.Task) {
		d.State, d.Lease = task.StateRunning, claim.Lease{Owner: "w", Epoch: 1, ExpiresAt: &past}
	})
	create(t, s, "delivery", func(d *protocol.Task) {
		d.State, d.Delivery = task.StateSucceeded, protocol.Delivery{State: task.DeliveryPending, NextAttemptAt: &past}
	})
	create(t, s, "notices", func(d *protocol.Task) {
		d.State = task.StateDead
		d.Notices = []protocol.Notice{{Stage: task.StageGeneration, Replay: 1, NextAttemptAt: &past}, {Stage: task.StageDelivery, Round: 2}}
	})
	create(t, s, "decision", func(d *protocol.Task) {
		d.State = task.StateQueued
		d.NotBefore = &future
		d.Decision = &protocol.Decision{At: past, Topics: []string{bus.TopicTasks, bus.TopicResults}}
	})
	create(t, s, "slack", func(d *protocol.Task) {
		d.State, d.SlackUpdate = task.StateDiscarded, &protocol.Pending{Keys: []string{"k"}}
	})
	create(t, s, "file-erase", func(d *protocol.Task) {
		d.State, d.FileErase = task.StateSucceeded, &protocol.Pending{Keys: []string{"files/gb-1"}, NextAttemptAt: &past}
	})
	create(t, s, "file-erase-grace", func(d *protocol.Task) {
		d.State, d.FileErase = task.StateSucceeded, &protocol.Pending{Keys: []string{"files/gb-2"}, NextAttemptAt: &future}
	})
	create(t, s, "done", func(d *protocol.Task) { d.State = task.StateSucceeded })

	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	if _, err := sw.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string][]testenv.Published{}
	for _, m := range pub.Take() {
		got[m.Attrs[task.AttrTaskID]] = append(got[m.Attrs[task.AttrTaskID]], m)
	}
	want := map[string][]string{
		"queued":          {bus.TopicTasks},
		"running-expired": {bus.TopicTasks},
		"delivery":        {bus.TopicResults},
		"notices":         {bus.TopicTasksDLQ, bus.TopicResultsDLQ},
		"decision":        {bus.TopicTasks, bus.TopicResults},
		"slack":           {bus.TopicTasksDLQ},
		"file-erase":      {bus.TopicTasks},
	}
	if len(got) != len(want) {
		t.Errorf("nudged %v, want %v", keys(got), want)
	}
	for id, topics := range want {
		if len(got[id]) != len(topics) {
			t.Errorf("%s: nudges %+v, want %v", id, got[id], topics)
			continue
		}
		for i, topic := range topics {
			if got[id][i].Topic != topic {
				t.Errorf("%s: nudge %d on %s, want %s", id, i, got[id][i].Topic, topic)
			}
		}
	}
	if n := got["notices"]; len(n) == 2 && (n[0].Attrs[task.AttrKind] != "notice" || n[0].Attrs[task.AttrReplay] != "1" || n[1].Attrs[task.AttrRound] != "2" || n[1].Attrs[task.AttrStage] != "delivery") {
		t.Errorf("notice attributes %+v", n)
	}
	if s := got["slack"]; len(s) == 1 && s[0].Attrs[task.AttrKind] != "slack_update" {
		t.Errorf("slack update attributes %+v", s[0].Attrs)
	}
	if e := got["file-erase"]; len(e) == 1 && e[0].Attrs[task.AttrKind] != store.KindFileErase {
		t.Errorf("file erase attributes %+v", e[0].Attrs)
	}
	// A decision whose nudges are all published is carried out: its topics are cleared.
	if d, err := s.GetTask(context.Background(), "decision"); err != nil || d.Decision == nil || len(d.Decision.Topics) != 0 {
		t.Errorf("decision after its nudges: %+v %v", d.Decision, err)
	}
	// The backoff is recorded: the next pass publishes nothing.
	doc, err := s.GetTask(context.Background(), "queued")
	if err != nil {
		t.Fatal(err)
	}
	if doc.Nudges != 1 || doc.NudgeAt == nil || doc.DueAt == nil || !doc.DueAt.Equal(*doc.NudgeAt) || doc.DueAt.Before(now.Add(50*time.Second)) {
		t.Errorf("after a nudge: nudges %d nudge_at %v due_at %v", doc.Nudges, doc.NudgeAt, doc.DueAt)
	}
	if _, err := sw.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if again := pub.Take(); len(again) != 0 {
		t.Errorf("second pass re-published %+v", again)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The backoff grows exponentially up to its cap, and a write by anyone else resets it.
func TestBackoffGrowsAndResets(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	advance := storeClock(s)
	create(t, s, "t", func(*protocol.Task) {})
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Minute, 3*time.Minute
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "me")
	ctx := context.Background()
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute, 3 * time.Minute} {
		if _, err := sw.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		doc, _ := s.GetTask(ctx, "t")
		if doc.Nudges != i+1 || !doc.NudgeAt.Equal(s.Now().Add(want)) {
			t.Fatalf("pass %d: nudges %d nudge_at in %v, want %d and %v", i, doc.Nudges, doc.NudgeAt.Sub(s.Now()), i+1, want)
		}
		if n := len(pub.Take()); n != 1 {
			t.Fatalf("pass %d published %d", i, n)
		}
		advance(want)
	}
	if _, err := s.MutateTask(ctx, "t", func(*protocol.Task, time.Time) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if doc, _ := s.GetTask(ctx, "t"); doc.Nudges != 0 || doc.NudgeAt != nil {
		t.Errorf("progress did not reset the backoff: %d %v", doc.Nudges, doc.NudgeAt)
	}
}

// A document changed between the query and the backoff write keeps its writer's version.
func TestGuardedWriteNeverErasesAChange(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	create(t, s, "t", func(*protocol.Task) {})
	ctx := context.Background()
	stale, err := s.GetTask(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.MutateTask(ctx, "t", func(d *protocol.Task, now time.Time) error {
		d.State = task.StateCancelled
		d.Finish(task.StateCancelled, now)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	sw.sweep(ctx, stale, newRound(strayPass), false)
	doc, _ := s.GetTask(ctx, "t")
	if doc.State != task.StateCancelled || doc.Nudges != 0 || doc.DueAt != nil {
		t.Errorf("guarded write applied over a change: state %s nudges %d due_at %v", doc.State, doc.Nudges, doc.DueAt)
	}
}

// parkedTasks creates the waiting tasks ids, past their backoff, on chain.
func parkedTasks(t *testing.T, s *store.Store, chain []string, ids ...string) {
	t.Helper()
	past := s.Now().Add(-time.Second)
	for _, id := range ids {
		create(t, s, id, func(d *protocol.Task) { d.State, d.NotBefore, d.ModelChain = task.StateWaiting, &past, chain })
	}
}

// heldBack fails t unless every task of ids is parked with its backoff untouched.
func heldBack(t *testing.T, s *store.Store, ids ...string) {
	t.Helper()
	for _, id := range ids {
		doc, err := s.GetTask(context.Background(), id)
		if err != nil || doc.State != task.StateWaiting || doc.Nudges != 0 || doc.NudgeAt == nil {
			t.Errorf("%s not held back: %+v %v", id, doc, err)
		}
	}
}

// Parked tasks are left alone while the breakers/{model} documents say every model of their
// chain is open — though this process never saw the outage: another instance's breakers opened —
// and are not looked at again each pass. Once a model closes every one is released, at the
// paced rate; once a retry time passes, one is released, as the probe.
func TestParkedTasksWaitForTheirBreakers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		recover func(t *testing.T, s *store.Store, advance func(time.Duration))
	}{
		{"closed", func(t *testing.T, s *store.Store, advance func(time.Duration)) {
			t.Helper()
			advance(time.Minute)
			if err := s.SaveBreaker(context.Background(), gemini.BreakerChange{Model: "m2", From: gemini.BreakerHalfOpen, To: gemini.BreakerClosed, At: s.Now(), Generation: 2}); err != nil {
				t.Fatal(err)
			}
		}},
		{"retry time passed", func(_ *testing.T, _ *store.Store, advance func(time.Duration)) { advance(time.Hour) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, pub := setup(t)
			advance := storeClock(s)
			ctx := context.Background()
			chain := []string{"m1", "m2"}
			parkedTasks(t, s, chain, "p1", "p2")
			parkedTasks(t, s, nil, "default-chain")
			for _, m := range chain {
				if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: m, From: gemini.BreakerClosed, To: gemini.BreakerOpen, At: s.Now(), RetryAt: s.Now().Add(time.Hour), Generation: 1}); err != nil {
					t.Fatal(err)
				}
			}
			cfg := testConfig()
			cfg.ReleaseRate = 0.001 // one release, then none within the test
			sw := New(s, pub, chain, slog.New(slog.DiscardHandler), cfg, "me")
			if _, err := sw.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			if n := pub.Take(); len(n) != 0 {
				t.Fatalf("parked tasks nudged while their chain is open: %+v", n)
			}
			heldBack(t, s, "p1", "p2", "default-chain")
			before := updateTimes(t, s, "p1", "p2", "default-chain")
			advance(cfg.BackoffBase)
			if _, err := sw.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			if after := updateTimes(t, s, "p1", "p2", "default-chain"); !maps.Equal(before, after) {
				t.Errorf("held tasks written again a backoff later: %v, then %v", before, after)
			}

			tc.recover(t, s, advance)
			if _, err := sw.releaseParked(ctx, false); err != nil {
				t.Fatal(err)
			}
			if n := pub.Take(); len(n) != 1 || n[0].Topic != bus.TopicTasks {
				t.Errorf("released %+v, want one: the paced release, or the probe", n)
			}
		})
	}
}

// updateTimes reads the update time of each task of ids.
func updateTimes(t *testing.T, s *store.Store, ids ...string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, id := range ids {
		doc, err := s.GetTask(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		out[id] = doc.UpdateTime
	}
	return out
}

// A parked task that names no chain, under a sweeper that knows no default one, has no breaker
// to wait for: it is released.
func TestParkedTaskWithoutAChain(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	parkedTasks(t, s, nil, "p")
	if _, err := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me").Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := pub.Take(); len(n) != 1 || n[0].Topic != bus.TopicTasks {
		t.Errorf("released %+v, want the parked task", n)
	}
}

// Breakers that cannot be read release nothing: a pass reads each chain once, logs it, and holds
// the chain's parked tasks. Once the reads have failed for BackoffMax, the tasks are released
// (paced) rather than held for good.
func TestUnreadableBreakersHoldParkedTasks(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	advance := storeClock(s)
	ctx := context.Background()
	chain := []string{"m1", "m2"}
	parkedTasks(t, s, chain, "p1", "p2", "p3")
	// A document this version cannot decode (say, from an incompatible writer); m2 has none, so
	// a readable chain would be available.
	if _, err := s.FS.Collection(store.BreakersCollection).Doc("m1").Set(ctx, map[string]any{"model": "m1", "state": 2}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Minute, 2*time.Minute
	cfg.ReleaseRate = math.Inf(1)
	sw := New(s, pub, chain, slog.New(slog.NewTextHandler(&logs, nil)), cfg, "me")
	for pass := range 2 {
		if _, err := sw.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		if n := pub.Take(); len(n) != 0 {
			t.Fatalf("pass %d released %+v while the breakers could not be read", pass, n)
		}
		heldBack(t, s, "p1", "p2", "p3")
		if n := strings.Count(logs.String(), "breakers not read"); n != pass+1 {
			t.Fatalf("after pass %d: %d failed reads logged, want one a pass\n%s", pass, n, logs.String())
		}
		advance(cfg.BackoffBase)
	}
	if _, err := sw.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pub.Take(); len(n) != 3 {
		t.Errorf("after the breakers were unreadable for %s: released %+v, want every parked task", cfg.BackoffMax, n)
	}
}

// Only one sweeper leads at a time; when it stops, another takes over.
func TestOneLeader(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	cfg := testConfig()
	a := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "a")
	b := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "b")
	ctx := context.Background()
	if _, err := a.shards[0].lease.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.shards[0].lease.Acquire(ctx); err == nil {
		t.Fatal("two leaders")
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	time.Sleep(3 * cfg.Interval)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := b.shards[0].lease.Acquire(ctx); err != nil {
		t.Errorf("leadership not handed over after the leader stopped: %v", err)
	}
}

// The registry the Terraform indexes are checked against lists the sweep queries as they run: a
// shard's (due_shard == k, due_at <= now, by due_at) and the strays' (due_at <= now, by due_at).
func TestSweepQueryRegistered(t *testing.T) {
	t.Parallel()
	want := map[string][]store.IndexField{
		"sweep":        {{Path: "due_shard", Order: store.Asc}, {Path: "due_at", Order: store.Asc}},
		"sweep-strays": {{Path: "due_at", Order: store.Asc}},
	}
	got := map[string][]store.IndexField{}
	for _, q := range store.Queries {
		if _, ok := want[q.Name]; ok && q.Collection == store.TasksCollection {
			got[q.Name] = q.Fields
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("registered sweep queries (-want +got):\n%s", diff)
	}
}

// Once a decision's nudges are out and nothing else is pending, the document leaves the sweep:
// no due_at, no pending_since, and its retention clock starts.
func TestDecisionCarriedOut(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	create(t, s, "d", func(d *protocol.Task) {
		d.State = task.StateDiscarded
		d.Decision = &protocol.Decision{At: time.Now().UTC().Add(-time.Second), Topics: []string{bus.TopicResults}}
	})
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	if _, err := sw.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := pub.Take(); len(n) != 1 || n[0].Topic != bus.TopicResults {
		t.Fatalf("published %+v", n)
	}
	d, err := s.GetTask(context.Background(), "d")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Decision.Topics) != 0 || d.DueAt != nil || d.PendingSince != nil || d.ExpireAt == nil || d.Nudges != 0 {
		t.Errorf("after the decision: topics %v due_at %v pending_since %v expire_at %v nudges %d", d.Decision.Topics, d.DueAt, d.PendingSince, d.ExpireAt, d.Nudges)
	}
}

// TestUnreachablePubSubEndsThePass shows a pass does not wait out a publish timeout for every due
// document while Pub/Sub is down: the first publish is cut off at the sweeper's own timeout, the
// pass ends with that error, and no other document is tried until the next pass.
func TestUnreachablePubSubEndsThePass(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	for _, id := range []string{"a", "b", "c"} {
		create(t, s, id, func(*protocol.Task) {})
	}
	var calls sync.Map
	pub.SetPublishFunc(func(ctx context.Context, _ string, _ []byte, attrs map[string]string) error {
		calls.Store(attrs[task.AttrTaskID], true)
		<-ctx.Done() // an unreachable Pub/Sub answers nothing
		return ctx.Err()
	})
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	sw.store.Now = func() time.Time { return time.Now().Add(time.Hour) }
	n, err := sw.Pass(context.Background())
	if err == nil || n != 0 {
		t.Fatalf("Pass = %d, %v; want 0 nudged and the publish error", n, err)
	}
	tried := 0
	calls.Range(func(any, any) bool { tried++; return true })
	if tried != 1 {
		t.Fatalf("%d documents tried while Pub/Sub was unreachable, want 1", tried)
	}
}

// A nudge whose backoff write loses to a transaction holding the document (the emulator, like
// Firestore, locks it: the write ends in Aborted) still counts: the next pass does not publish it
// again before its backoff, so contention is not fed a fresh claim on every pass. A write by
// anyone else is progress and ends that backoff.
func TestBackoffKeptWhenItsWriteLosesToContention(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	create(t, s, "t", func(*protocol.Task) {})
	ctx := context.Background()
	ref := s.Tasks().Doc("t")
	held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	go func() {
		done <- s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
			_, err := tx.Get(ref)
			once.Do(func() { close(held) })
			<-release
			return err
		})
	}()
	<-held
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	if _, err := sw.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(pub.Take()); n != 1 {
		t.Fatalf("first pass published %d nudges, want 1", n)
	}
	if doc, err := s.GetTask(ctx, "t"); err != nil || doc.Nudges != 0 {
		t.Fatalf("the backoff write was meant to lose to the held transaction: nudges %d (%v)", doc.Nudges, err)
	}
	for range 3 {
		if _, err := sw.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if again := pub.Take(); len(again) != 0 {
		t.Fatalf("passes within the backoff re-published %d nudges", len(again))
	}
	if _, err := s.MutateTask(ctx, "t", func(*protocol.Task, time.Time) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(pub.Take()); n != 1 {
		t.Errorf("after progress the pass published %d nudges, want 1", n)
	}
}

// The backoffs kept in memory stay bounded: a pass cut at Limit (a lasting backlog) still drops
// those ended BackoffMax ago, and a complete pass drops every ended one whose document is no
// longer due. A backoff still running is kept by both.
func TestUnrecordedBackoffsAreBounded(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	cfg := testConfig()
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "me")
	now := time.Now().UTC()
	for id, at := range map[string]time.Time{"running": now.Add(time.Minute), "ended": now.Add(-time.Second), "long-ended": now.Add(-cfg.BackoffMax)} {
		sw.remember(id, unrecorded{nudgeAt: at})
	}
	kept := func() []string { return slices.Sorted(maps.Keys(sw.unrecorded)) }
	sw.forgetUnseen(0, map[string]bool{}, false, now)
	if got := kept(); !slices.Equal(got, []string{"ended", "running"}) {
		t.Errorf("after a pass cut at Limit: %v, want ended and running", got)
	}
	sw.forgetUnseen(0, map[string]bool{}, true, now)
	if got := kept(); !slices.Equal(got, []string{"running"}) {
		t.Errorf("after a complete pass: %v, want running", got)
	}
}

// An instance that finds another leading drops the backoffs it kept in memory: they were its
// own passes', and the leader keeps its own.
func TestLosingLeadershipForgetsUnrecordedBackoffs(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	cfg := testConfig()
	cfg.LeaderTTL = time.Hour
	a := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "a")
	b := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "b")
	ctx := context.Background()
	if _, err := a.shards[0].lease.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	b.remember("t", unrecorded{nudgeAt: time.Now().Add(time.Hour)})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(cfg.Interval) {
		b.mu.Lock()
		n := len(b.unrecorded)
		b.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("an instance that is not the leader still keeps its unrecorded backoffs after 30 s")
		}
	}
}

// offers is a Local that takes the first n offers and records what was offered.
type offers struct {
	mu    sync.Mutex
	room  int
	taken []string
	seen  []*protocol.Task // the document as the offer found it
	s     *store.Store
}

func (o *offers) Offer(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.room == 0 {
		return false
	}
	o.room--
	o.taken = append(o.taken, id)
	if doc, err := o.s.GetTask(context.Background(), id); err == nil {
		o.seen = append(o.seen, doc)
	}
	return true
}

// A due task goes to the leader's own instance when it has room, after its backoff is recorded
// (a claim taken at once would otherwise race that write); only what it has no room for is
// published. Other nudges are published as before.
func TestDueTasksGoToTheLeadersInstanceFirst(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	past := time.Now().UTC().Add(-time.Minute)
	create(t, s, "a", func(*protocol.Task) {})
	create(t, s, "b", func(d *protocol.Task) { d.CreatedAt = past })
	create(t, s, "delivery", func(d *protocol.Task) {
		d.State, d.Delivery = task.StateSucceeded, protocol.Delivery{State: task.DeliveryPending, NextAttemptAt: &past}
	})
	local := &offers{room: 1, s: s}
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me", WithLocal(local))
	if _, err := sw.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(local.taken) != 1 || local.taken[0] != "b" {
		t.Fatalf("offered %v, want the oldest due task taken", local.taken)
	}
	if d := local.seen[0]; d.Nudges != 1 || d.NudgeAt == nil {
		t.Errorf("the task was offered before its backoff was recorded: nudges %d nudge_at %v", d.Nudges, d.NudgeAt)
	}
	got := map[string]string{}
	for _, m := range pub.Take() {
		got[m.Attrs[task.AttrTaskID]] = m.Topic
	}
	if want := map[string]string{"a": bus.TopicTasks, "delivery": bus.TopicResults}; !maps.Equal(got, want) {
		t.Errorf("published %v, want %v", got, want)
	}
}

// While Pub/Sub is unreachable the leader still hands the due tasks of the pass to its own
// instance: a failed publish stops the publishing, not the pass, and what could not be published
// is left due for the next one.
func TestUnreachablePubSubStillClaimsLocally(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	past := time.Now().UTC().Add(-time.Minute)
	create(t, s, "delivery", func(d *protocol.Task) {
		d.State, d.CreatedAt = task.StateSucceeded, past.Add(-time.Minute)
		d.Delivery = protocol.Delivery{State: task.DeliveryPending, NextAttemptAt: &past}
	})
	for _, id := range []string{"a", "b"} {
		create(t, s, id, func(*protocol.Task) {})
	}
	pub.SetPublishFunc(func(ctx context.Context, _ string, _ []byte, _ map[string]string) error {
		<-ctx.Done() // an unreachable Pub/Sub answers nothing
		return ctx.Err()
	})
	local := &offers{room: 10, s: s}
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me", WithLocal(local))
	if _, err := sw.Pass(context.Background()); err == nil {
		t.Error("the pass hid that a nudge could not be published")
	}
	if !slices.Equal(slices.Sorted(slices.Values(local.taken)), []string{"a", "b"}) {
		t.Errorf("taken here %v, want both due tasks though Pub/Sub is unreachable", local.taken)
	}
	if d, err := s.GetTask(context.Background(), "delivery"); err != nil || d.Nudges != 0 {
		t.Errorf("the unpublished delivery nudge was recorded as sent (%v)", err)
	}
}
