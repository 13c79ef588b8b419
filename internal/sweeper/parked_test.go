package sweeper

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// breakerDoc writes the breakers/{model} document of model as an instance would have.
func breakerDoc(t *testing.T, s *store.Store, model, state string, gen int64, retryAt time.Time) {
	t.Helper()
	doc := map[string]any{"model": model, "state": state, "since": s.Now(), "generation": gen, "updated_at": s.Now()}
	if !retryAt.IsZero() {
		doc["retry_at"] = retryAt
	}
	if _, err := s.FS.Collection(store.BreakersCollection).Doc(model).Set(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
}

// nudged returns the ids of the gemini-tasks nudges published so far.
func nudged(pub *testenv.Publisher) map[string]bool {
	out := map[string]bool{}
	for _, m := range pub.Take() {
		if m.Topic == bus.TopicTasks {
			out[m.Attrs[task.AttrTaskID]] = true
		}
	}
	return out
}

// The parked tasks of a chain that can take calls again are released at the release rate within
// a pass: a limiter that was only asked whether a token was there right now let one task of the
// pass through and held the rest for a whole backoff.
func TestParkedTasksReleasedAtTheirRate(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	ids := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
	parkedTasks(t, s, []string{"m"}, ids...)
	cfg := testConfig()
	cfg.ReleaseRate, cfg.Interval = 20, 5*time.Second // 8 tasks take 0.35 s of a 5 s interval
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "me")
	if _, err := sw.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := nudged(pub); len(got) != len(ids) {
		t.Errorf("released %d of %d parked tasks in one pass, want all at the release rate", len(got), len(ids))
	}
}

// While a chain's probe is in flight (half-open, its lease still running) nothing more is
// released into it: the tasks would find the breaker probing and be parked again with a longer
// backoff. Once a model may take a probe (open past its retry time), one task is released — its
// call is the probe — and the others wait for its outcome.
func TestProbingChainReleasesOneTask(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	advance := storeClock(s)
	ctx := context.Background()
	parkedTasks(t, s, []string{"m"}, "a", "b", "c")
	breakerDoc(t, s, "m", "half_open", 2, s.Now().Add(time.Minute))
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	if _, err := sw.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := nudged(pub); len(got) != 0 {
		t.Errorf("released %v while the chain's probe is in flight", got)
	}
	breakerDoc(t, s, "m", "open", 3, s.Now().Add(time.Minute))
	advance(2 * time.Minute) // past the retry time: a probe may go
	if _, err := sw.releaseParked(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got := nudged(pub); len(got) != 1 {
		t.Errorf("released %v once a probe may go, want one task", got)
	}
}

// Parked tasks whose own park backoff runs long are released when their chain recovers — as the
// breakers/{model} documents say, whoever saw it — not when that backoff ends: the leader wakes at
// the change and lets every task of the chain go.
func TestParkedTasksReleasedWhenTheirChainCloses(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	later := time.Now().UTC().Add(10 * time.Minute)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		create(t, s, id, func(d *protocol.Task) {
			d.State, d.NotBefore, d.ModelChain, d.Parks = task.StateWaiting, &later, []string{"m"}, 3
		})
	}
	breakerDoc(t, s, "m", "open", 1, time.Now().UTC().Add(time.Hour))
	cfg := testConfig()
	cfg.Interval = 100 * time.Millisecond
	w := s.WatchBreakers(slog.New(slog.DiscardHandler))
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "me", WithBreakers(w))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { w.Run(ctx); done <- struct{}{} }()
	go func() { _ = sw.Run(ctx); done <- struct{}{} }()
	defer func() { stop(); <-done; <-done }()
	time.Sleep(time.Second) // a few passes while the chain is open
	if got := nudged(pub); len(got) != 0 {
		t.Fatalf("released %v while the chain is open", got)
	}
	breakerDoc(t, s, "m", "closed", 2, time.Time{})
	got := map[string]bool{}
	for deadline := time.Now().Add(30 * time.Second); len(got) < len(ids) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for id := range nudged(pub) {
			got[id] = true
		}
	}
	if len(got) != len(ids) {
		t.Errorf("released %v after the chain closed, want every parked task", got)
	}
	for _, id := range ids {
		if doc, err := s.GetTask(ctx, id); err != nil || doc.NotBefore != nil {
			t.Errorf("%s released with its park backoff left in place (%v)", id, err)
		}
	}
}

// A task parked past its run_before is nudged whatever its chain says: its claim fails it as
// expired, instead of it waiting out the outage past its deadline.
func TestExpiredParkedTaskIsNudged(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	now := time.Now().UTC()
	later, past := now.Add(time.Hour), now.Add(-time.Second)
	create(t, s, "late", func(d *protocol.Task) {
		d.State, d.NotBefore, d.RunBefore, d.ModelChain = task.StateWaiting, &later, &past, []string{"m"}
	})
	breakerDoc(t, s, "m", "open", 1, later)
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	if _, err := sw.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := nudged(pub); !got["late"] {
		t.Errorf("nudged %v, want the task past its run_before", got)
	}
}

// A decision's nudges are published within the sweeper's publish timeout, as every other nudge:
// an unreachable Pub/Sub does not hold the pass for the client's own timeout.
func TestDecisionNudgesHaveThePublishTimeout(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	create(t, s, "d", func(d *protocol.Task) {
		d.State = task.StateDiscarded
		d.Decision = &protocol.Decision{At: time.Now().UTC().Add(-time.Second), Topics: []string{bus.TopicResults}}
	})
	pub.SetPublishFunc(func(ctx context.Context, _ string, _ []byte, _ map[string]string) error {
		<-ctx.Done() // an unreachable Pub/Sub answers nothing
		return ctx.Err()
	})
	cfg := testConfig()
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "me")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, _ = sw.Pass(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the pass waited %s for a decision nudge, want the publish timeout (%s)", time.Since(start).Round(time.Second), sw.publishTimeout())
	}
	if d, err := s.GetTask(context.Background(), "d"); err != nil || len(d.Decision.Topics) != 1 {
		t.Errorf("the decision's unpublished nudge must stay for the next pass: %+v %v", d.Decision, err)
	}
}

// Until the breaker listener has read the breakers, a parked task is held for one interval only
// (the listener is starting), and the new leader's look at every parked task is tried again
// rather than taken as done.
func TestBreakersNotReadYetHoldBriefly(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	storeClock(s)
	parkedTasks(t, s, []string{"m"}, "p")
	w := s.WatchBreakers(slog.New(slog.DiscardHandler)) // never run: nothing read
	cfg := testConfig()
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "me", WithBreakers(w))
	ctx := context.Background()
	if _, err := sw.releaseParked(ctx, true); err == nil {
		t.Error("the takeover's look at the parked tasks succeeded without their breakers")
	}
	if _, err := sw.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := nudged(pub); len(got) != 0 {
		t.Errorf("released %v without knowing their breakers", got)
	}
	doc, err := s.GetTask(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if doc.NudgeAt == nil || doc.NudgeAt.After(s.Now().Add(cfg.Interval)) {
		t.Errorf("held until %v, want one interval (%s)", doc.NudgeAt, cfg.Interval)
	}
}
