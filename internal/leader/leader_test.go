package leader_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/leader"
	"github.com/genbox-dev/genbox/pkg/claim"
)

// elector is a hand-written Elector and Renewer: each Acquire answers the next of acquires (the
// last one repeats), and it records what was released and renewed.
type elector struct {
	mu        sync.Mutex
	acquires  []acquired
	released  []int64
	RenewFunc func(epoch int64) error
}

type acquired struct {
	epoch int64
	err   error
}

func (e *elector) Acquire(context.Context) (claim.Lease, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.acquires[0]
	if len(e.acquires) > 1 {
		e.acquires = e.acquires[1:]
	}
	return claim.Lease{Epoch: a.epoch}, a.err
}

func (e *elector) Release(_ context.Context, epoch int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.released = append(e.released, epoch)
	return nil
}

func (e *elector) Renew(_ context.Context, epoch int64) (claim.Lease, error) {
	return claim.Lease{Epoch: epoch}, e.RenewFunc(epoch)
}

var quiet = slog.New(slog.DiscardHandler)

// A pass runs only while the elector says this instance leads, with the epoch it leads at; Left
// is told each time another instance leads; a failed election runs nothing and tells nobody;
// the leadership held when the loop stops is released.
func TestLoopRunsPassesOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := &elector{acquires: []acquired{
			{epoch: 1}, {epoch: 1}, {err: claim.ErrHeld}, {err: errors.New("firestore unavailable")},
			{err: claim.ErrLeaseLost}, {epoch: 3},
		}}
		var passes []int64
		left := 0
		l := &leader.Loop{Name: "test", Elector: e, Interval: time.Second, Log: quiet, Left: func() { left++ }}
		ctx, stop := context.WithTimeout(t.Context(), 7*time.Second+time.Millisecond)
		defer stop()
		l.Run(ctx, func(_ context.Context, epoch int64) time.Time {
			passes = append(passes, epoch)
			return time.Time{}
		})
		if diff := cmp.Diff([]int64{1, 1, 3, 3, 3}, passes); diff != "" {
			t.Errorf("passes' epochs (-want +got):\n%s", diff)
		}
		if left != 2 {
			t.Errorf("Left told %d times, want 2 (held, then lost)", left)
		}
		if diff := cmp.Diff([]int64{3}, e.released); diff != "" {
			t.Errorf("released on stop (-want +got):\n%s", diff)
		}
	})
}

// A loop that does not lead when it stops releases nothing.
func TestLoopReleasesNothingItDoesNotHold(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := &elector{acquires: []acquired{{epoch: 1}, {err: claim.ErrHeld}}}
		l := &leader.Loop{Name: "test", Elector: e, Interval: time.Second, Log: quiet}
		ctx, stop := context.WithTimeout(t.Context(), 2*time.Second+time.Millisecond)
		defer stop()
		l.Run(ctx, func(context.Context, int64) time.Time { return time.Time{} })
		if len(e.released) != 0 {
			t.Errorf("released %v, want nothing: another instance leads", e.released)
		}
	})
}

// Without an elector every pass runs; a pass's again time runs the next one before the tick, and
// a Wake channel does too.
func TestLoopWakesBeforeTheTick(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		wake := make(chan struct{})
		var at []time.Duration
		l := &leader.Loop{Name: "test", Interval: time.Minute, Log: quiet,
			Wake: func() <-chan struct{} { return wake }}
		ctx, stop := context.WithCancel(t.Context())
		defer stop()
		go func() {
			time.Sleep(20 * time.Second)
			close(wake)
		}()
		l.Run(ctx, func(context.Context, int64) time.Time {
			at = append(at, time.Since(start))
			switch len(at) {
			case 1:
				return time.Now().Add(10 * time.Second)
			case 2:
				return time.Time{}
			}
			stop()
			return time.Time{}
		})
		if diff := cmp.Diff([]time.Duration{0, 10 * time.Second, 20 * time.Second}, at); diff != "" {
			t.Errorf("passes at (-want +got):\n%s", diff)
		}
	})
}

// With RenewEvery, a pass that outlasts its lease is renewed while it runs, and ends (its ctx)
// when a renewal is refused.
func TestLoopRenewsDuringAPassAndEndsItWhenLost(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		renewals := 0
		e := &elector{acquires: []acquired{{epoch: 4}}, RenewFunc: func(epoch int64) error {
			if epoch != 4 {
				t.Errorf("renewed epoch %d, want 4", epoch)
			}
			renewals++
			if renewals == 3 {
				return claim.ErrLeaseLost
			}
			return nil
		}}
		l := &leader.Loop{Name: "test", Elector: e, Interval: time.Minute, RenewEvery: 10 * time.Second, Log: quiet}
		ctx, stop := context.WithCancel(t.Context())
		defer stop()
		var ran time.Duration
		l.Run(ctx, func(ctx context.Context, _ int64) time.Time {
			start := time.Now()
			<-ctx.Done()
			ran = time.Since(start)
			stop()
			return time.Time{}
		})
		if renewals != 3 || ran != 30*time.Second {
			t.Errorf("the pass ran %s with %d renewals, want 30s: ended by the third, refused", ran, renewals)
		}
	})
}
