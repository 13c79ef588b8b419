package worker

import (
	"context"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A nudge for a scheduled task before its start — a stray one, or one replayed by Pub/Sub — is
// acked and changes nothing: no claim, no model call. From its start on the same nudge runs it.
func TestScheduledTaskNeverStartsEarly(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	start := time.Now().Add(time.Hour)
	b.task(t, "later", func(d *protocol.Task) { d.Schedule(start) })
	ctx := context.Background()
	h := b.handler(policy("w1"), chain("m"))
	h.Handle(ctx, msg("later"))
	if got := b.get(t, "later"); got.State != task.StateScheduled || got.Lease.Epoch != 0 || b.srv.Ledger().Total.Calls != 0 {
		t.Fatalf("nudged before its start: state %s, epoch %d, %d model calls; want scheduled, unclaimed, none",
			got.State, got.Lease.Epoch, b.srv.Ledger().Total.Calls)
	}
	at := *b.store
	at.Now = func() time.Time { return start } // the clock at start_after
	New(&at, b.gen, chain("m"), b.pub, b.log, policy("w2")).Handle(ctx, msg("later"))
	got := b.get(t, "later")
	if got.State != task.StateSucceeded || b.srv.Ledger().Total.Calls != 1 {
		t.Fatalf("at its start: state %s, %d model calls; want succeeded after one", got.State, b.srv.Ledger().Total.Calls)
	}
}

// A scheduled task whose run_before passed before anything started it fails as expired at its
// claim, without a model call, as a queued one does.
func TestScheduledTaskExpires(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	start := time.Now().Add(time.Hour)
	rb := start.Add(time.Minute)
	b.task(t, "missed", func(d *protocol.Task) { d.RunBefore = &rb; d.Schedule(start) })
	late := *b.store
	late.Now = func() time.Time { return rb.Add(time.Second) }
	New(&late, b.gen, chain("m"), b.pub, b.log, policy("w1")).Handle(context.Background(), msg("missed"))
	got := b.get(t, "missed")
	if got.State != task.StateFailed || got.Error == nil || got.Error.Kind != task.KindExpired || b.srv.Ledger().Total.Calls != 0 {
		t.Fatalf("past run_before: state %s, error %+v, %d model calls; want failed as expired, none", got.State, got.Error, b.srv.Ledger().Total.Calls)
	}
}
