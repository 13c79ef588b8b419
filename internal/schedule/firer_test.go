package schedule_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/schedule"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

const tenant = "acme"

// counting is the publisher's intake, counting the tasks its submits created; after kill
// submits it cancels the pass, as a process killed in the middle of it.
type counting struct {
	*publisher.Intake
	created atomic.Int64
	submits atomic.Int64
	kill    int64
	cancel  context.CancelFunc
}

func (c *counting) Submit(ctx context.Context, tenant, key string, req *task.Request) (string, bool, error) {
	id, created, err := c.Intake.Submit(ctx, tenant, key, req)
	if created {
		c.created.Add(1)
	}
	if n := c.submits.Add(1); c.kill > 0 && n == c.kill {
		c.cancel()
	}
	return id, created, err
}

// bundle is what a firer test needs: a store on the emulator whose clock the test moves, and a
// firer over the publisher's intake.
type bundle struct {
	t       *testing.T
	project string
	clock   *testenv.Clock
	st      *store.Store
	firers  atomic.Int64 // firers made, to name their owners
}

func setup(t *testing.T, start time.Time) *bundle {
	t.Helper()
	project := emulator.ProjectID(t)
	clock := testenv.NewClock(start)
	return &bundle{t: t, project: project, clock: clock, st: newStore(t, project, clock)}
}

func newStore(t *testing.T, project string, clock *testenv.Clock) *store.Store {
	t.Helper()
	st := store.New(testenv.Firestore(t, project))
	st.Now = clock.Now
	st.MaxAttempts = 50
	return st
}

// firer is a firer of its own store (another instance) on b's emulator project and clock.
func (b *bundle) firer() (*schedule.Firer, *counting) {
	fams, err := prompts.Default()
	if err != nil {
		b.t.Fatal(err)
	}
	st := newStore(b.t, b.project, b.clock)
	in := &counting{Intake: publisher.NewIntake(publisher.IntakeDeps{Store: st, Publisher: &testenv.Publisher{}, Families: fams})}
	owner := fmt.Sprintf("firer-%d", b.firers.Add(1))
	return schedule.New(st, in, schedule.Config{Interval: 5 * time.Millisecond, LeaderTTL: 3 * time.Second, Limit: 100}, owner, slog.New(slog.DiscardHandler)), in
}

// schedule writes a schedule of tenant whose next fire is the first after the clock's now.
func (b *bundle) schedule(expr, zone, overlap, catchUp string) *store.Schedule {
	b.t.Helper()
	spec, err := schedule.Parse(expr, zone)
	if err != nil {
		b.t.Fatal(err)
	}
	tmpl, _ := json.Marshal(task.Request{Family: "summarize", Variant: prompts.DefaultVariant, Input: "the news of {{fire_date}}", SubjectKey: "nightly/{{fire_date}}"})
	next := spec.Next(b.clock.Now())
	sc := &store.Schedule{ID: "0123456789abcdef0123456789abcdef", Tenant: tenant, Cron: expr, TimeZone: zone, Task: string(tmpl),
		Overlap: overlap, CatchUp: catchUp, NextFireAt: &next}
	if err := b.st.CreateSchedule(context.Background(), sc); err != nil {
		b.t.Fatal(err)
	}
	return sc
}

// fired returns the fire times of the schedule's tasks (by their idempotency keys), in order,
// and the tasks by fire time (in UTC).
func (b *bundle) fired(sc *store.Schedule) ([]time.Time, map[time.Time]*protocol.Task) {
	b.t.Helper()
	tasks, _, err := b.st.ListTasks(context.Background(), tenant, "", 100, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	byTime := map[time.Time]*protocol.Task{}
	var out []time.Time
	for _, lt := range tasks {
		t, err := b.st.GetTask(context.Background(), lt.ID)
		if err != nil {
			b.t.Fatal(err)
		}
		var at time.Time
		for _, c := range []string{"2026", "2027"} {
			prefix := "schedule:" + sc.ID + ":" + c
			if len(t.IdempotencyKey) > len(prefix) && t.IdempotencyKey[:len(prefix)] == prefix {
				at, err = time.Parse(time.RFC3339, t.IdempotencyKey[len("schedule:"+sc.ID+":"):])
			}
		}
		if err != nil || at.IsZero() {
			b.t.Fatalf("task %s has idempotency key %q: not a fire of schedule %s", t.ID, t.IdempotencyKey, sc.ID)
		}
		out = append(out, at)
		byTime[at] = t
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out, byTime
}

func pass(t *testing.T, f *schedule.Firer) int {
	t.Helper()
	n, err := f.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func at(zone string, y int, m time.Month, d, h, min int) time.Time {
	loc, _ := time.LoadLocation(zone)
	return time.Date(y, m, d, h, min, 0, 0, loc)
}

func utc(ts []time.Time) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.UTC().Format(time.RFC3339)
	}
	return out
}

// TestFiresOnTimeAcrossDST moves the clock 10 minutes per pass over New York's spring forward
// and fall back: each fire is submitted in the first pass at or after its time, once, and its
// task's subject_key names its day in the zone.
func TestFiresOnTimeAcrossDST(t *testing.T) {
	t.Parallel()
	const ny = "America/New_York"
	const step = 10 * time.Minute
	for _, tc := range []struct {
		name       string
		expr       string
		start, end time.Time
		want       []time.Time
	}{
		{"spring forward: 02:30 does not exist on 03-08 and fires at 03:30 EDT", "30 2 * * *",
			at(ny, 2026, 3, 6, 12, 5), at(ny, 2026, 3, 10, 0, 5),
			[]time.Time{at(ny, 2026, 3, 7, 2, 30), at(ny, 2026, 3, 8, 3, 30), at(ny, 2026, 3, 9, 2, 30)}},
		{"fall back: 01:30 happens twice on 11-01 and fires once", "30 1 * * *",
			at(ny, 2026, 10, 30, 12, 5), at(ny, 2026, 11, 3, 0, 5),
			[]time.Time{at(ny, 2026, 10, 31, 1, 30), time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC), at(ny, 2026, 11, 2, 1, 30)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.start)
			sc := b.schedule(tc.expr, ny, task.OverlapQueue, task.CatchUpNone)
			f, in := b.firer()
			var passedAt []time.Time
			for ; b.clock.Now().Before(tc.end); b.clock.Add(step) {
				if pass(t, f) > 0 {
					passedAt = append(passedAt, b.clock.Now())
				}
			}
			got, tasks := b.fired(sc)
			if diff := cmp.Diff(utc(tc.want), utc(got)); diff != "" {
				t.Fatalf("fire times (-want +got):\n%s", diff)
			}
			if n := in.created.Load(); n != int64(len(tc.want)) {
				t.Errorf("%d tasks created, want %d", n, len(tc.want))
			}
			for i, want := range tc.want {
				if lag := passedAt[i].Sub(want); lag < 0 || lag >= step {
					t.Errorf("fire %s submitted at %s: %s after its time, want within one pass (%s)", want, passedAt[i], lag, step)
				}
				if sk, day := tasks[want.UTC()].SubjectKey, want.In(mustLoc(ny)).Format(time.DateOnly); sk != "nightly/"+day {
					t.Errorf("fire %s has subject_key %q, want nightly/%s (its day in %s)", want, sk, day, ny)
				}
			}
		})
	}
}

func mustLoc(zone string) *time.Location {
	loc, err := time.LoadLocation(zone)
	if err != nil {
		panic(err)
	}
	return loc
}

// TestCatchUpAfterOutage stops the firer for five hourly fires and starts another: catch_up all
// submits each missed fire once, last only the latest, none none; the next fire is on time
// either way. The all case is killed in the middle of its catch-up first: the fires it
// submitted before dying are found again, not doubled, and none is lost.
func TestCatchUpAfterOutage(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 7, 0, 10, 0, 0, time.UTC)
	h := func(n int) time.Time { return time.Date(2026, 12, 7, n, 0, 0, 0, time.UTC) }
	for _, tc := range []struct {
		catchUp string
		kill    int64 // the pass after the outage dies after this many submits
		want    []time.Time
	}{
		{task.CatchUpAll, 3, []time.Time{h(1), h(2), h(3), h(4), h(5), h(6)}},
		{task.CatchUpLast, 0, []time.Time{h(5), h(6)}},
		{task.CatchUpNone, 0, []time.Time{h(6)}},
	} {
		t.Run(tc.catchUp, func(t *testing.T) {
			t.Parallel()
			b := setup(t, start)
			sc := b.schedule("0 * * * *", "UTC", task.OverlapQueue, tc.catchUp)
			f, _ := b.firer()
			if n := pass(t, f); n != 0 {
				t.Fatalf("a pass before the first fire submitted %d", n)
			}
			b.clock.Set(h(5).Add(30 * time.Minute)) // down from 00:10 to 05:30
			if tc.kill > 0 {
				killed, in := b.firer()
				ctx, cancel := context.WithCancel(context.Background())
				in.kill, in.cancel = tc.kill, cancel
				if _, err := killed.Pass(ctx); err == nil {
					t.Fatal("the killed pass returned no error")
				}
				if n := in.created.Load(); n != tc.kill {
					t.Fatalf("the killed pass created %d tasks, want %d", n, tc.kill)
				}
			}
			restarted, in := b.firer()
			pass(t, restarted)
			b.clock.Set(h(6).Add(30 * time.Second))
			pass(t, restarted)
			got, _ := b.fired(sc)
			if diff := cmp.Diff(utc(tc.want), utc(got)); diff != "" {
				t.Errorf("fire times (-want +got):\n%s", diff)
			}
			if n := in.created.Load() + tc.kill; n != int64(len(tc.want)) {
				t.Errorf("%d tasks created over both runs, want %d: one per fire", n, len(tc.want))
			}
			after, err := b.st.GetSchedule(context.Background(), sc.ID)
			if err != nil {
				t.Fatal(err)
			}
			if want := h(7); !after.NextFireAt.Equal(want) {
				t.Errorf("next_fire_at = %s, want %s", after.NextFireAt, want)
			}
		})
	}
}

// TestTwoFirersNeverFireTwice runs two firers, each on its own client, passing at once on every
// minute of two hours of a five-minute schedule: as two leaders would while a lease lapsed.
// Every fire's task is created once.
func TestTwoFirersNeverFireTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Date(2026, 12, 7, 0, 0, 30, 0, time.UTC))
	sc := b.schedule("*/5 * * * *", "Europe/Paris", task.OverlapQueue, task.CatchUpAll)
	f1, in1 := b.firer()
	f2, in2 := b.firer()
	for range 120 {
		b.clock.Add(time.Minute)
		var wg sync.WaitGroup
		for _, f := range []*schedule.Firer{f1, f2} {
			wg.Go(func() {
				if _, err := f.Pass(context.Background()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	got, _ := b.fired(sc)
	if len(got) != 24 {
		t.Fatalf("%d fires have a task, want 24 (every five minutes for two hours)", len(got))
	}
	if n1, n2 := in1.created.Load(), in2.created.Load(); n1+n2 != 24 {
		t.Errorf("the firers created %d + %d tasks, want 24 in all: one per fire", n1, n2)
	}
	after, err := b.st.GetSchedule(context.Background(), sc.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.Skipped != 0 {
		t.Errorf("skipped = %d, want 0", after.Skipped)
	}
}

// TestOverlapSkip: a fire while the previous fire's task is queued is skipped; once that task
// has finished, the next fire runs.
func TestOverlapSkip(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Date(2026, 12, 7, 0, 5, 0, 0, time.UTC))
	sc := b.schedule("*/10 * * * *", "UTC", task.OverlapSkip, task.CatchUpNone)
	f, _ := b.firer()
	m := func(n int) time.Time { return time.Date(2026, 12, 7, 0, n, 0, 0, time.UTC) }
	b.clock.Set(m(10))
	pass(t, f)
	b.clock.Set(m(20))
	if n := pass(t, f); n != 0 {
		t.Fatalf("the 00:20 fire was submitted while the 00:10 task is queued")
	}
	_, tasks := b.fired(sc)
	if _, err := b.st.MutateTask(context.Background(), tasks[m(10).UTC()].ID, func(t *protocol.Task, now time.Time) error {
		t.Finish(task.StateCancelled, now)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(m(30))
	pass(t, f)
	got, _ := b.fired(sc)
	if diff := cmp.Diff(utc([]time.Time{m(10), m(30)}), utc(got)); diff != "" {
		t.Errorf("fire times (-want +got):\n%s", diff)
	}
	after, err := b.st.GetSchedule(context.Background(), sc.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := [2]int64{after.Fires, after.Skipped}, [2]int64{2, 1}; got != want {
		t.Errorf("fires and skipped = %v, want %v", got, want)
	}
}

// TestRunFiresOnceAcrossLeaders runs two firers' leader loops at once while the clock moves a
// minute at a time over a minutely schedule: whichever leads, each fire is one task, and both
// loops give their lease up when stopped.
func TestRunFiresOnceAcrossLeaders(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 7, 0, 0, 30, 0, time.UTC)
	b := setup(t, start)
	sc := b.schedule("* * * * *", "UTC", task.OverlapQueue, task.CatchUpAll)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var created []*counting
	for range 2 {
		f, in := b.firer()
		created = append(created, in)
		wg.Go(func() { f.Run(ctx) })
	}
	const fires = 10
	deadline := time.Now().Add(time.Minute)
	for i := 1; i <= fires && time.Now().Before(deadline); {
		b.clock.Set(start.Add(time.Duration(i) * time.Minute))
		if got, _ := b.fired(sc); len(got) == i {
			i++
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	got, _ := b.fired(sc)
	if len(got) != fires {
		t.Fatalf("%d fires have a task, want %d", len(got), fires)
	}
	if n := created[0].created.Load() + created[1].created.Load(); n != fires {
		t.Errorf("the leaders created %d tasks for %d fires", n, fires)
	}
	snap, err := b.st.FS.Collection(store.LeadersCollection).Doc(schedule.LeaderDoc).Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if owner, _ := snap.DataAt("owner"); owner != "" {
		t.Errorf("the scheduler lease is still held by %v after both loops stopped", owner)
	}
}
