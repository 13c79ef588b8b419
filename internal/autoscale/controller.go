package autoscale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/leader"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Controller sizes the pool. Run it in every worker instance: only the holder of the
// leaders/autoscaler lease acts.
type Controller struct {
	cfg   Config
	store *store.Store
	pool  Pool
	log   *slog.Logger
	lease *claim.Doc
	doc   *firestore.DocumentRef

	// The leader's own view, reset when it takes the lead.
	epoch    int64
	synced   bool              // the document's count was checked against the pool's
	latency  time.Duration     // how long a call holds its slot, as measured
	seen     map[string]member // each live member as last read: its served calls and busy time
	lowSince time.Time         // when the backlog first asked for fewer instances than there are
	lowPeak  int               // the most it asked for since
}

// NewController returns the controller of cfg's pool, whose lease is held as owner.
func NewController(cfg Config, s *store.Store, pool Pool, owner string, log *slog.Logger) *Controller {
	return &Controller{
		cfg: cfg, store: s, pool: pool, log: log,
		lease:   s.Leader(LeaderDoc, owner, leaderTTL(cfg)),
		doc:     stateDoc(s.FS, cfg),
		latency: cfg.Latency,
		seen:    map[string]member{},
	}
}

// leaderTTL is the controller's lease: three ticks, and at least ten seconds, well above what a
// step can take on a loaded instance, so that a slow leader does not see another step beside it.
func leaderTTL(cfg Config) time.Duration { return max(3*cfg.Interval, 10*time.Second) }

func stateDoc(fs *firestore.Client, cfg Config) *firestore.DocumentRef {
	return fs.Collection(Collection).Doc(cfg.poolID())
}

// Run steps the pool every Interval while this instance leads, until ctx ends; it then gives the
// lead up.
func (c *Controller) Run(ctx context.Context) {
	loop := &leader.Loop{Name: "autoscaler", Elector: c.lease, Interval: c.cfg.Interval, Log: c.log,
		Left: func() { c.epoch = 0 }}
	loop.Run(ctx, func(ctx context.Context, epoch int64) time.Time {
		if epoch != c.epoch {
			c.epoch, c.synced, c.lowSince, c.seen = epoch, false, time.Time{}, map[string]member{}
		}
		if err := c.Step(ctx); err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "autoscale step failed; tried again next tick", "error", err)
		}
		return time.Time{}
	})
}

// Step reads the pool's document, its members and the backlog once and moves the pool one step:
// up at once, down after a drain, to zero after IdleAfter with nothing pending.
func (c *Controller) Step(ctx context.Context) error {
	now := c.store.Now()
	st, err := readState(ctx, c.doc)
	if err != nil {
		return err
	}
	if !c.synced {
		if st, err = c.sync(ctx, st); err != nil {
			return err
		}
	}
	live, err := liveMembers(ctx, c.doc, now)
	if err != nil {
		return err
	}
	c.measure(live)
	b, err := c.backlog(ctx)
	if err != nil {
		return err
	}
	want := c.cfg.Want(b, c.latency)
	if st.Draining {
		return c.drain(ctx, st, live, want, now)
	}
	if want >= st.Instances {
		c.lowSince = time.Time{}
		if want > st.Instances {
			return c.scale(ctx, st.Instances, want, b)
		}
		return nil
	}
	if c.lowSince.IsZero() {
		c.lowSince, c.lowPeak = now, want
	}
	c.lowPeak = max(c.lowPeak, want)
	wait := c.cfg.ScaleInAfter
	if c.lowPeak == 0 {
		wait = c.cfg.IdleAfter
	}
	if now.Sub(c.lowSince) < wait {
		return nil
	}
	target := c.lowPeak
	c.lowSince = time.Time{}
	c.log.InfoContext(ctx, "pool draining", "from", st.Instances, "to", target)
	return c.set(ctx, func(s *State) error {
		if s.Draining {
			return errUnchanged
		}
		s.Draining, s.Settling, s.Target, s.Epoch = true, false, target, s.Epoch+1
		s.DrainFrom = &now
		return nil
	})
}

// sync makes the document's count the pool's as Cloud Run reports it, once per leadership.
func (c *Controller) sync(ctx context.Context, st State) (State, error) {
	n, err := c.pool.Instances(ctx)
	if err != nil {
		return st, err
	}
	if n != st.Instances && !st.Draining {
		if err := c.set(ctx, func(s *State) error { s.Instances = n; return nil }); err != nil {
			return st, err
		}
		st.Instances = n
	}
	c.synced = true
	return st, nil
}

// scale raises the pool from n to want instances.
func (c *Controller) scale(ctx context.Context, n, want int, b Backlog) error {
	if err := c.pool.SetInstances(ctx, want); err != nil {
		return err
	}
	c.log.InfoContext(ctx, "pool scaled out", "from", n, "to", want, "queued", b.Queued, "running", b.Running,
		"latency_ms", c.latency.Milliseconds())
	return c.set(ctx, func(s *State) error { s.Instances = max(s.Instances, want); return nil })
}

// drain moves a drain on: it ends it when the backlog asks for more than its target; lowers the
// count once every live member has drained (or DrainTimeout passed: forced); and ends it once
// the instances Cloud Run stopped have left.
func (c *Controller) drain(ctx context.Context, st State, live []member, want int, now time.Time) error {
	elapsed := now.Sub(*st.DrainFrom)
	if st.Settling {
		if len(live) > st.Target && elapsed < 2*c.cfg.DrainTimeout {
			return nil
		}
		return c.set(ctx, func(s *State) error {
			s.Draining, s.Settling = false, false
			return nil
		})
	}
	if want > st.Target {
		c.log.InfoContext(ctx, "drain called off: the backlog grew", "target", st.Target, "want", want)
		return c.set(ctx, func(s *State) error {
			if s.Epoch != st.Epoch || s.Settling {
				return errUnchanged
			}
			s.Draining = false
			return nil
		})
	}
	drained := true
	for _, m := range live {
		drained = drained && m.Drained >= st.Epoch
	}
	if (!drained || elapsed < c.cfg.Interval) && elapsed < c.cfg.DrainTimeout {
		return nil
	}
	forced := int64(0)
	if !drained {
		forced = 1
		c.log.WarnContext(ctx, "drain timed out: the count is lowered with calls in flight", "target", st.Target)
	}
	if st.Target == 0 {
		return c.sleep(context.WithoutCancel(ctx), st, forced)
	}
	if err := c.pool.SetInstances(ctx, st.Target); err != nil {
		return err
	}
	c.log.InfoContext(ctx, "pool scaled in", "from", st.Instances, "to", st.Target)
	return c.set(ctx, func(s *State) error {
		s.Instances, s.Settling, s.Forced = st.Target, true, s.Forced+forced
		return nil
	})
}

// sleep takes the drained pool to zero. The document says zero first, while the drain still
// holds: a waker that ended the drain meanwhile has the pool stay up; one that comes after sees
// zero and starts an instance itself. A wake between the two writes is seen by the second,
// which starts the instance again: the later count wins at Cloud Run, and is one. It runs on a
// context that the instance's own SIGTERM, which the count of zero brings, does not end.
func (c *Controller) sleep(ctx context.Context, st State, forced int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Interval)
	defer cancel()
	err := updateState(ctx, c.store.FS, c.doc, func(s *State) error {
		if !s.Draining || s.Epoch != st.Epoch {
			return errUnchanged
		}
		s.Instances, s.Forced = 0, s.Forced+forced
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := c.pool.SetInstances(ctx, 0); err != nil {
		return err
	}
	woken := false
	if err := c.set(ctx, func(s *State) error {
		woken = s.WakeAt != nil && s.WakeAt.After(*st.DrainFrom)
		s.Draining = false
		if woken {
			s.Instances = max(s.Instances, 1)
		}
		return nil
	}); err != nil {
		return err
	}
	if woken {
		_, err := c.pool.Raise(ctx, 1)
		return err
	}
	c.log.InfoContext(ctx, "pool asleep: nothing pending", "idle_after", c.cfg.IdleAfter.String())
	return nil
}

// measure updates the call latency from what the live members served since the last step.
func (c *Controller) measure(live []member) {
	var served, busy int64
	seen := make(map[string]member, len(live))
	for _, m := range live {
		if p, ok := c.seen[m.Owner]; ok && m.Served >= p.Served {
			served += m.Served - p.Served
			busy += m.BusyMS - p.BusyMS
		}
		seen[m.Owner] = m
	}
	c.seen = seen
	if served > 0 {
		sample := time.Duration(busy/served) * time.Millisecond
		c.latency = (c.latency + sample) / 2
	}
}

// backlog counts what the pool has to do.
func (c *Controller) backlog(ctx context.Context) (Backlog, error) {
	n, err := c.store.CountStates(ctx, task.StateQueued, task.StateRunning, task.StateWaiting)
	if err != nil {
		return Backlog{}, err
	}
	pending, err := c.store.AnyPending(ctx)
	if err != nil {
		return Backlog{}, err
	}
	if !pending {
		if pending, err = c.store.WorkersWillRun(ctx); err != nil {
			return Backlog{}, err
		}
	}
	inBatch, err := c.store.BatchTasksInFlight(ctx)
	if err != nil {
		return Backlog{}, err
	}
	var batched int64
	for _, k := range inBatch {
		batched += int64(k.Tasks)
	}
	running := n[task.StateRunning]
	return Backlog{Queued: n[task.StateQueued], Running: max(running-batched, 0), Batched: min(batched, running), Waiting: n[task.StateWaiting], Pending: pending}, nil
}

// errUnchanged makes update write nothing.
var errUnchanged = errors.New("unchanged")

// readState reads the pool's document; a missing one is the zero State.
func readState(ctx context.Context, doc *firestore.DocumentRef) (State, error) {
	var st State
	snap, err := doc.Get(ctx)
	if status.Code(err) == codes.NotFound {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read %s: %w", doc.Path, err)
	}
	if err := snap.DataTo(&st); err != nil {
		return st, fmt.Errorf("decode %s: %w", doc.Path, err)
	}
	return st, nil
}

// set applies fn to the pool's document (updateState); fn returning errUnchanged is no error.
func (c *Controller) set(ctx context.Context, fn func(*State) error) error {
	if err := updateState(ctx, c.store.FS, c.doc, fn); !errors.Is(err, errUnchanged) {
		return err
	}
	return nil
}

// updateState applies fn to the pool's document in a transaction; fn returning errUnchanged
// writes nothing and is returned as is.
func updateState(ctx context.Context, fs *firestore.Client, doc *firestore.DocumentRef, fn func(*State) error) error {
	err := fs.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		var st State
		snap, err := tx.Get(doc)
		switch {
		case status.Code(err) == codes.NotFound:
		case err != nil:
			return err
		default:
			if err := snap.DataTo(&st); err != nil {
				return err
			}
		}
		if err := fn(&st); err != nil {
			return err
		}
		st.UpdatedAt = time.Now().UTC()
		return tx.Set(doc, st)
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return fmt.Errorf("update %s: %w", doc.Path, err)
	}
	return err
}

// liveMembers reads the members of the pool alive at now, deleting the expired documents of
// instances that died without deleting their own.
func liveMembers(ctx context.Context, doc *firestore.DocumentRef, now time.Time) ([]member, error) {
	it := doc.Collection("members").Documents(ctx)
	defer it.Stop()
	var live []member
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return live, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read pool members: %w", err)
		}
		var m member
		if err := snap.DataTo(&m); err != nil {
			continue
		}
		if !now.Before(m.ExpiresAt) {
			_, _ = snap.Ref.Delete(ctx, firestore.LastUpdateTime(snap.UpdateTime))
			continue
		}
		live = append(live, m)
	}
}
