package autoscale

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
)

// newTestMember returns a member of a pool of its own on the emulator, and the pool's document.
func newTestMember(t *testing.T) (*Member, func(instances int)) {
	t.Helper()
	id := emulator.ProjectID(t)
	fs := testenv.Firestore(t, id)
	cfg := Config{Pool: "projects/" + id + "/locations/r/workerPools/genbox-worker", Interval: 20 * time.Millisecond}
	m := NewMember(cfg, fs, "instance-1", func() Load { return Load{Slots: 1} }, func(float64) {}, slog.New(slog.DiscardHandler))
	set := func(instances int) {
		t.Helper()
		if _, err := stateDoc(fs, cfg).Set(context.Background(), State{Instances: instances}); err != nil {
			t.Fatal(err)
		}
	}
	return m, set
}

// A change no listener delivered is seen by the member's next heartbeat, which reads the pool's
// document: the emulator has been seen to give a new listener the document as it was before a
// write, after the write, and never the write.
func TestHeartbeatReadsThePoolsDocument(t *testing.T) {
	t.Parallel()
	m, set := newTestMember(t)
	set(3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.heartbeat(ctx) }() // no listener: the beats alone
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st, _, ok := m.current(); ok && st.Instances == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the member never took the pool's count of 3 from its heartbeats")
		}
	}
}

// A snapshot older than the state a member holds is not taken: a listener's late delivery of
// the document before a write cannot move the member back.
func TestMemberKeepsTheNewerState(t *testing.T) {
	t.Parallel()
	m, set := newTestMember(t)
	ctx := context.Background()
	set(1)
	older, err := m.doc.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set(3)
	newer, err := m.doc.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.apply(ctx, newer)
	m.apply(ctx, older)
	if st, _, _ := m.current(); st.Instances != 3 {
		t.Errorf("after the newer snapshot then the older: %d instances, want 3", st.Instances)
	}
}
