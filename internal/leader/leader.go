// Package leader owns the one loop every background service runs in each instance (the sweeper's
// shards, the batcher, the fallback drill, the schedule firer, the re-run pacer, the autoscaler):
// elect, run one pass while leading, wait for the next tick, and give the leadership up when the
// instance stops — River's elector and its maintenance services with one runOnce. The services
// keep what a pass does; who may run it is an Elector, most often a *claim.Doc lease in the
// leaders collection.
package leader

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/genbox-dev/genbox/pkg/claim"
)

// Elector decides before each pass whether this instance runs it (a *claim.Doc).
type Elector interface {
	// Acquire takes or keeps the leadership; claim.ErrHeld or claim.ErrLeaseLost means another
	// instance leads.
	Acquire(ctx context.Context) (claim.Lease, error)
	// Release gives up the leadership held at epoch.
	Release(ctx context.Context, epoch int64) error
}

// Renewer extends a leadership during a pass that may outlast it (a *claim.Doc).
type Renewer interface {
	Renew(ctx context.Context, epoch int64) (claim.Lease, error)
}

var (
	_ Elector = (*claim.Doc)(nil)
	_ Renewer = (*claim.Doc)(nil)
)

// Pass runs once while this instance leads at epoch. It returns when it wants to run again
// before the next tick (the zero time: at the tick).
type Pass func(ctx context.Context, epoch int64) (again time.Time)

// Loop runs a Pass every Interval while its Elector says this instance leads.
type Loop struct {
	// Name starts the loop's log messages ("sweeper" logs "sweeper leadership").
	Name string
	// Elector is who may run; nil runs every pass in every instance.
	Elector Elector
	// Interval is the time between passes.
	Interval time.Duration
	// RenewEvery, when positive, renews the leadership that often during a pass and ends the
	// pass (its ctx) when the renewal is refused. Elector must then be a Renewer too.
	RenewEvery time.Duration
	// Wake, when set, is called before each election; a pass also runs when its channel is
	// ready, before the tick.
	Wake func() <-chan struct{}
	// Left, when set, is called whenever another instance leads.
	Left func()
	// Log receives the failures of the election.
	Log *slog.Logger
	// Now is the clock the again times of the passes are read on (time.Now when nil).
	Now func() time.Time
}

// Run elects and runs pass every Interval until ctx ends, then releases the leadership it holds
// so that another instance need not wait for it to expire.
func (l *Loop) Run(ctx context.Context, pass Pass) {
	tick := time.NewTicker(l.Interval)
	defer tick.Stop()
	var epoch int64
	defer func() {
		if epoch > 0 {
			_ = l.Elector.Release(context.WithoutCancel(ctx), epoch)
		}
	}()
	var again time.Time
	for {
		var wake <-chan struct{}
		if l.Wake != nil {
			wake = l.Wake()
		}
		lease, err := l.elect(ctx)
		switch {
		case err == nil:
			epoch = lease.Epoch
			again = l.run(ctx, pass, epoch)
		case errors.Is(err, claim.ErrHeld), errors.Is(err, claim.ErrLeaseLost):
			epoch, again = 0, time.Time{}
			if l.Left != nil {
				l.Left()
			}
		case ctx.Err() == nil:
			l.Log.WarnContext(ctx, l.Name+" leadership", "error", err)
		}
		if !l.wait(ctx, tick.C, wake, again) {
			return
		}
	}
}

func (l *Loop) elect(ctx context.Context) (claim.Lease, error) {
	if l.Elector == nil {
		return claim.Lease{}, nil
	}
	return l.Elector.Acquire(ctx)
}

// wait returns at the tick, on wake or at again, false when ctx ended.
func (l *Loop) wait(ctx context.Context, tick <-chan time.Time, wake <-chan struct{}, again time.Time) bool {
	var retry <-chan time.Time
	if !again.IsZero() {
		timer := time.NewTimer(max(again.Sub(l.now()), 0))
		defer timer.Stop()
		retry = timer.C
	}
	select {
	case <-ctx.Done():
	case <-tick:
	case <-wake:
	case <-retry:
	}
	return ctx.Err() == nil
}

func (l *Loop) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// run runs pass at epoch, renewing the leadership every RenewEvery while it lasts: a pass may
// take longer than the lease. A refused renewal ends the pass's ctx.
func (l *Loop) run(ctx context.Context, pass Pass, epoch int64) time.Time {
	if l.RenewEvery <= 0 {
		return pass(ctx, epoch)
	}
	renewer := l.Elector.(Renewer)
	passCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(l.RenewEvery)
		defer tick.Stop()
		for {
			select {
			case <-passCtx.Done():
				return
			case <-tick.C:
			}
			if _, err := renewer.Renew(passCtx, epoch); err != nil && passCtx.Err() == nil {
				l.Log.WarnContext(ctx, l.Name+" leadership lost during a pass; pass ended", "error", err)
				cancel()
				return
			}
		}
	}()
	again := pass(passCtx, epoch)
	cancel()
	<-done
	return again
}
