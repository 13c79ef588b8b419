package resulthandler

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/fscount"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The worker's commit reserves the delivery for the nudge it publishes (protocol.Task.ReserveDelivery).
// The resulthandler receiving that nudge POSTs under the reservation after one read, and writes
// only the outcome; a reservation with less than a POST's time left is taken over by a claim; a
// nudge naming another epoch leaves a live reservation alone.
func TestReservedDelivery(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		ttl      time.Duration // the reservation's
		epochOff int64         // added to the reservation's epoch in the nudge
		want     fscount.Counts
		posts    int
	}{
		{name: "under the reservation", ttl: time.Minute, want: fscount.Counts{Reads: 1, Writes: 1, Commits: 1}, posts: 1},
		{name: "too little time left: taken over", ttl: time.Second, want: fscount.Counts{Reads: 2, Writes: 2, Commits: 2}, posts: 1},
		{name: "another epoch: left to its holder", ttl: time.Minute, epochOff: 1, want: fscount.Counts{Reads: 2}, posts: 0},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			id := "r" + strconv.Itoa(i)
			now := e.clock.Now()
			tk := &protocol.Task{ID: id, Tenant: tenant, Family: "summarize", Variant: "default", Input: "x",
				CallbackURL: e.recv.URL(), State: task.StateRunning, CreatedAt: now}
			tk.Output, tk.OutputAt = "a summary", &now
			tk.Finish(task.StateSucceeded, now)
			epoch := tk.ReserveDelivery(now, tc.ttl)
			if epoch == 0 {
				t.Fatal("nothing reserved")
			}
			if err := e.st.CreateTask(e.ctx, tk); err != nil {
				t.Fatal(err)
			}

			counter := &fscount.Counter{}
			fs, err := counter.EmulatorClient(e.ctx, os.Getenv(emulator.FirestoreHostEnv), e.project)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fs.Close() })
			counted := store.New(fs)
			counted.Now = e.clock.Now
			h := e.handler(t, e.policy)
			h.store = counted
			h.Handle(e.ctx, &bus.Message{ID: "m", Attributes: map[string]string{
				task.AttrTaskID: id, task.AttrDeliveryEpoch: strconv.FormatInt(epoch+tc.epochOff, 10)}})

			if diff := cmp.Diff(tc.want, counter.Counts()); diff != "" {
				t.Errorf("Firestore operations (-want +got):\n%s", diff)
			}
			if got := len(e.recv.Hooks()); got != tc.posts {
				t.Errorf("%d POSTs, want %d", got, tc.posts)
			}
			got := testenv.GetTask(t, e.st, id).Delivery
			wantState := task.DeliveryDelivered
			if tc.posts == 0 {
				wantState = task.DeliveryPending
			}
			if got.State != wantState || got.Attempts != 1 {
				t.Errorf("delivery %s after %d attempts, want %s after 1", got.State, got.Attempts, wantState)
			}
		})
	}
}
