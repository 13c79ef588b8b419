package store_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/fscount"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

func setup(t *testing.T) *store.Store {
	t.Helper()
	s := store.New(testenv.Firestore(t, emulator.ProjectID(t)))
	s.MaxAttempts = 50
	s.Secrets = testenv.Secrets()
	return s
}

func newTask(id string) *protocol.Task {
	return &protocol.Task{ID: id, Tenant: "acme", Family: "summarize", Variant: "default", Input: "hello",
		State: task.StateQueued, CallbackURL: "https://example.com/hook"}
}

func TestCreateTaskIsTheDedup(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if err := s.CreateTask(ctx, newTask("t1")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTask(ctx, newTask("t1")); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	got, err := s.GetTask(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if got.DueAt == nil || got.PendingSince == nil {
		t.Fatalf("a queued task must be due and pending: %+v", got)
	}
	if _, err := s.GetTask(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get missing: %v, want ErrNotFound", err)
	}
}

// TestMutateTaskCommitsATransaction shows a read-modify-write on the emulator, its due_at derived
// from the document, and that ErrNoChange writes nothing.
func TestMutateTaskCommitsATransaction(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if err := s.CreateTask(ctx, newTask("t1")); err != nil {
		t.Fatal(err)
	}
	before, _ := s.GetTask(ctx, "t1")
	if _, err := s.MutateTask(ctx, "t1", func(t *protocol.Task, now time.Time) error { return store.ErrNoChange }); err != nil {
		t.Fatal(err)
	}
	same, _ := s.GetTask(ctx, "t1")
	if !same.UpdateTime.Equal(before.UpdateTime) {
		t.Fatalf("ErrNoChange wrote the document")
	}

	out, err := s.MutateTask(ctx, "t1", func(t *protocol.Task, now time.Time) error {
		t.Output, t.OutputAt = "done", &now
		t.Finish(task.StateSucceeded, now)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetTask(ctx, "t1")
	if got.State != task.StateSucceeded || got.Output != "done" || got.Delivery.State != task.DeliveryPending {
		t.Fatalf("after finish: state %s output %q delivery %s", got.State, got.Output, got.Delivery.State)
	}
	if got.Delivery.EventID != "t1.task.succeeded.0" || got.DueAt == nil || !got.DueAt.Equal(*out.DueAt) {
		t.Fatalf("the pending delivery must be due: event %q due %v", got.Delivery.EventID, got.DueAt)
	}

	_, err = s.MutateTask(ctx, "t1", func(t *protocol.Task, now time.Time) error {
		t.Delivery.State, t.Delivery.DeliveredAt = task.DeliveryDelivered, &now
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	done, _ := s.GetTask(ctx, "t1")
	if done.DueAt != nil || done.PendingSince != nil || done.ExpireAt == nil {
		t.Fatalf("nothing pending: due_at %v pending_since %v expire_at %v", done.DueAt, done.PendingSince, done.ExpireAt)
	}
	due, err := s.Tasks().Where("due_at", "<=", time.Now().Add(time.Hour)).Documents(ctx).GetAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 0 {
		t.Fatalf("a finished, delivered task must not be found by the sweep query")
	}
	if _, err := s.MutateTask(ctx, "missing", func(*protocol.Task, time.Time) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("mutate missing: %v, want ErrNotFound", err)
	}
}

// TestMutateTaskLosesNoUpdateUnderContention runs concurrent read-modify-writes of one document.
func TestMutateTaskLosesNoUpdateUnderContention(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if err := s.CreateTask(ctx, newTask("hot")); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.MutateTask(ctx, "hot", func(t *protocol.Task, now time.Time) error {
				t.Attempts++
				return nil
			})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, _ := s.GetTask(ctx, "hot")
	if got.Attempts != n {
		t.Fatalf("attempts = %d, want %d: an update was lost", got.Attempts, n)
	}
}

// TestMutateTaskHoldsNoLock shows that a read-modify-write in progress — one whose process may be
// killed before it writes — does not lock the task: another writer commits meanwhile, at once,
// and the first then decides again from what that one wrote. A transaction would lock the
// document from its read until Firestore expires it (about a minute on the emulator when its
// process is killed), holding every other writer of the task: a claim, an output, a delivery.
func TestMutateTaskHoldsNoLock(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.MaxAttempts = 0 // the client's default: a locked document aborts the other writer
	ctx := context.Background()
	if err := s.CreateTask(ctx, newTask("t")); err != nil {
		t.Fatal(err)
	}
	read, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first := make(chan error, 1)
	var runs int
	go func() {
		_, err := s.MutateTask(ctx, "t", func(t *protocol.Task, now time.Time) error {
			runs++
			once.Do(func() { close(read); <-release })
			t.Attempts++
			return nil
		})
		first <- err
	}()
	<-read
	start := time.Now()
	if _, err := s.MutateTask(ctx, "t", func(t *protocol.Task, now time.Time) error {
		t.Claims++
		return nil
	}); err != nil {
		t.Fatalf("a write while another read-modify-write was in progress: %v (after %s)", err, time.Since(start))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the write waited %s for a read-modify-write in progress", d)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTask(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempts != 1 || got.Claims != 1 || runs != 2 {
		t.Errorf("attempts %d claims %d after %d runs of the first change; want both changes, the first decided again", got.Attempts, got.Claims, runs)
	}
}

func TestNewerEventQueuesBehindThePendingOne(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tk := newTask("t1")
	tk.Finish(task.StateDead, now)
	tk.QueueEvent(task.EventDiscarded, now)
	if tk.Delivery.EventType != task.EventDead || len(tk.Delivery.Queue) != 1 {
		t.Fatalf("pending event overwritten: %+v", tk.Delivery)
	}
	tk.Delivery.State = task.DeliveryDelivered
	tk.AdvanceDelivery(now)
	if tk.Delivery.EventType != task.EventDiscarded || tk.Delivery.State != task.DeliveryPending || len(tk.Delivery.Queue) != 0 {
		t.Fatalf("queued event not started: %+v", tk.Delivery)
	}
	noHook := newTask("t2")
	noHook.CallbackURL = ""
	noHook.Finish(task.StateSucceeded, now)
	if noHook.Delivery.State != task.DeliveryNone {
		t.Fatalf("without a callback there is nothing to deliver: %s", noHook.Delivery.State)
	}
}

// MutateTaskFrom writes from the task as last written without reading it, when nobody wrote it
// since; when someone did, the conditioned write is refused and fn decides again on what is
// stored, so the other write is never overwritten.
func TestMutateTaskFromReadsOnlyWhenChanged(t *testing.T) {
	t.Parallel()
	counter := &fscount.Counter{}
	fs, err := counter.EmulatorClient(context.Background(), os.Getenv(emulator.FirestoreHostEnv), emulator.ProjectID(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	s := store.New(fs)
	ctx := context.Background()
	if err := s.CreateTask(ctx, newTask("t1")); err != nil {
		t.Fatal(err)
	}
	known, err := s.MutateTask(ctx, "t1", func(t *protocol.Task, _ time.Time) error { t.Attempts = 1; return nil })
	if err != nil {
		t.Fatal(err)
	}
	before := counter.Counts()
	known, err = s.MutateTaskFrom(ctx, known, func(t *protocol.Task, _ time.Time) error { t.Attempts++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(fscount.Counts{Writes: 1, Commits: 1}, counter.Counts().Sub(before)); diff != "" {
		t.Errorf("an unchanged document (-want +got):\n%s", diff)
	}

	if _, err := s.MutateTask(ctx, "t1", func(t *protocol.Task, _ time.Time) error { t.Labels = map[string]string{"by": "other"}; return nil }); err != nil {
		t.Fatal(err)
	}
	got, err := s.MutateTaskFrom(ctx, known, func(t *protocol.Task, _ time.Time) error { t.Attempts++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := s.GetTask(ctx, "t1")
	for _, tk := range []*protocol.Task{got, stored} {
		if tk.Attempts != 3 || tk.Labels["by"] != "other" {
			t.Errorf("attempts %d labels %v, want 3 and the other write's label", tk.Attempts, tk.Labels)
		}
	}
}
