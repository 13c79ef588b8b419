package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A generation longer than the subscription's ack deadline (10 s deadline, 25 s generation) is
// delivered once: the pull keeps extending the deadline while the handler runs.
func TestGenerationLongerThanAckDeadline(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 25 s generation")
	}
	b := setup(t, 25*time.Second)
	ctx := context.Background()
	top := bus.DefaultTopology()
	top.AckDeadline = 10 * time.Second
	ps := testenv.Bus(t, b.project, top)
	b.task(t, "long")
	pub := bus.NewPublisher(ps)
	defer pub.Close()
	if _, err := pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: "long"}); err != nil {
		t.Fatal(err)
	}
	pol := policy("w1")
	pol.LeaseTTL, pol.RenewEvery = 5*time.Second, time.Second
	h := b.handler(pol, chain("m"))
	var deliveries atomic.Int64
	pullCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- bus.Pull(pullCtx, ps, bus.SubWorker, bus.PullSettings{MaxOutstandingMessages: 4, MaxExtension: 2 * time.Minute},
			bus.HandlerFunc(func(ctx context.Context, m *bus.Message) bus.Result {
				deliveries.Add(1)
				return h.Handle(ctx, m)
			}))
	}()
	waitFor(t, "the long generation to succeed", 90*time.Second, func() bool { return b.get(t, "long").State == task.StateSucceeded })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := deliveries.Load(); n != 1 {
		t.Errorf("delivered %d times, want once", n)
	}
	if n := b.srv.Ledger().Total.Calls; n != 1 {
		t.Errorf("%d model calls", n)
	}
}
