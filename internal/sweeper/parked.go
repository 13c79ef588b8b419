package sweeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"google.golang.org/api/iterator"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Breakers says what the breakers of a chain allow the tasks parked on it (store.BreakerWatch,
// or the store itself, read per chain and pass). One that also has Changed() <-chan struct{}
// wakes the leader at each change, so a recovery any instance sees releases parked tasks at once.
type Breakers interface {
	ChainState(ctx context.Context, models []string, now time.Time) (store.ChainState, error)
}

// WithBreakers makes the sweeper follow b instead of reading the breakers/{model} documents.
func WithBreakers(b Breakers) Option { return func(s *Sweeper) { s.breakers = b } }

var (
	_ Breakers = (*store.Store)(nil)
	_ Breakers = (*store.BreakerWatch)(nil)
)

// changed is the channel the breakers close at their next change; nil when they cannot tell.
func (s *Sweeper) changed() <-chan struct{} {
	if c, ok := s.breakers.(interface{ Changed() <-chan struct{} }); ok {
		return c.Changed()
	}
	return nil
}

// chainViews is what a pass, or a release, learnt of each chain (by chainKey).
type chainViews map[string]*chainView

type chainView struct {
	models []string
	state  store.ChainState
	err    error // its breakers could not be read
	logged bool  // and that was logged
	probed bool  // a task was released as its probe
}

func chainKey(models []string) string { return strings.Join(models, "\n") }

// budgetWait reports whether t waits for its tenant's daily budget, not for its chain.
func budgetWait(t *protocol.Task) bool { return t.Error != nil && t.Error.Kind == task.KindBudget }

// view returns what the breakers of t's chain (the default chain when it names none) allow.
func (s *Sweeper) view(ctx context.Context, views chainViews, t *protocol.Task, now time.Time) (string, *chainView) {
	models := t.ModelChain
	if len(models) == 0 {
		models = s.defaultChain
	}
	key := chainKey(models)
	if v, ok := views[key]; ok {
		return key, v
	}
	v := &chainView{models: models}
	v.state, v.err = s.breakers.ChainState(ctx, models, now)
	views[key] = v
	return key, v
}

// parked decides for a due task whether it may go now: the zero time if so, else the time it is
// held until. Only a waiting task on a chain that cannot take calls is held: a queued, running or
// expired one, or one waiting for its tenant's budget, goes. Of a chain's parked tasks, those of a
// closed chain are released at the paced rate (held for the rest of the pace when it is beyond
// the pass); while no model is closed, one task per pass is released when a model may take a
// probe — its call is the probe — and the others are held until the chain closes, when
// releaseParked lets them all go, or at most BackoffMax (never past their run_before). A chain
// whose breakers cannot be read holds its tasks for BackoffBase at a time, and releases them once
// they have been unreadable for BackoffMax: releasing into an outage the sweeper cannot see would
// undo the parking, but a document that can never be read must not hold tasks for good.
func (s *Sweeper) parked(ctx context.Context, t *protocol.Task, views chainViews, now time.Time) time.Time {
	if t.State != task.StateWaiting || t.Expired(now) || budgetWait(t) {
		return time.Time{}
	}
	key, v := s.view(ctx, views, t, now)
	switch {
	case v.err != nil:
		since := s.unreadableSince(key, now)
		long := now.Sub(since) >= s.cfg.BackoffMax
		if !v.logged {
			v.logged = true
			if long {
				s.log.ErrorContext(ctx, "breakers unreadable too long; parked tasks released", "models", v.models, "unreadable_since", since, "error", v.err)
			} else {
				s.log.WarnContext(ctx, "breakers not read; parked tasks held", "models", v.models, "unreadable_since", since, "error", v.err)
			}
		}
		switch {
		case long:
		case errors.Is(v.err, store.ErrBreakersUnknown): // not read yet (the listener is starting): soon
			return now.Add(s.cfg.Interval)
		default:
			return now.Add(s.cfg.BackoffBase)
		}
	case v.state.Closed:
		s.readable(key)
	case v.state.Probe && !v.probed:
		s.readable(key)
		v.probed = true
	default:
		s.readable(key)
		s.hold(key, v.models)
		return s.holdLong(t, now)
	}
	// The release rate is kept by waiting within the pass, and beyond what the pass can wait, by
	// holding the task for the rest of its turn: a limiter that only answers "now or not" lets one
	// task of a pass through and holds the rest for a whole backoff.
	r := s.release.Reserve()
	if d := r.Delay(); d > s.cfg.Interval {
		r.Cancel()
		return now.Add(d)
	} else if d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	return time.Time{}
}

// holdLong is how long a task parked on a chain that cannot take calls is left alone: until the
// chain closes (releaseParked) or BackoffMax, and never past its run_before.
func (s *Sweeper) holdLong(t *protocol.Task, now time.Time) time.Time {
	until := now.Add(s.cfg.BackoffMax)
	if t.RunBefore != nil && t.RunBefore.Before(until) {
		until = *t.RunBefore
	}
	return until
}

func (s *Sweeper) readable(key string) {
	s.mu.Lock()
	delete(s.unreadable, key)
	s.mu.Unlock()
}

// hold remembers that this leader holds parked tasks of the chain key.
func (s *Sweeper) hold(key string, models []string) {
	s.mu.Lock()
	s.held[key] = models
	s.mu.Unlock()
}

// releaseParked lets go the parked tasks whose chain's breakers allow it, whatever their own park
// backoff says: every task of a chain that closed, and one task of a chain that may take a probe
// (its call is the probe). It looks at the chains whose tasks this leader holds, and only when one
// of them allows something; after a takeover (full), at every waiting task, as the previous
// leader's holds are not known here. It returns when a held chain may next take a probe (zero:
// nothing to wait for).
func (s *Sweeper) releaseParked(ctx context.Context, full bool) (time.Time, error) {
	now := s.store.Now().UTC()
	rd := newRound(0)
	views := rd.chains
	s.mu.Lock()
	held := make(map[string][]string, len(s.held))
	for k, m := range s.held {
		held[k] = m
	}
	s.mu.Unlock()
	var next time.Time
	later := func(at time.Time) {
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	wanted := full
	for key, models := range held {
		st, err := s.breakers.ChainState(ctx, models, now)
		if err != nil {
			continue
		}
		views[key] = &chainView{models: models, state: st}
		if st.Closed || st.Probe {
			wanted = true
		}
		later(st.RetryAt)
	}
	if !wanted {
		return next, nil
	}
	if full {
		s.mu.Lock()
		clear(s.held)
		s.mu.Unlock()
	}
	it := s.store.ParkedTasks().Documents(ctx)
	defer it.Stop()
	released, complete := 0, true
	var unknown error // a chain whose breakers could not be read: its tasks are looked at again
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return next, fmt.Errorf("parked tasks: %w", err)
		}
		t, err := store.DecodeTask(snap)
		if err != nil || t.Expired(now) || budgetWait(t) {
			continue // an undecodable task is logged by the pass; an expired one is due and failed there
		}
		key, v := s.view(ctx, views, t, now)
		switch {
		case v.err != nil:
			unknown, complete = v.err, false
			continue
		case v.state.Probe && !v.probed:
			v.probed = true
		case !v.state.Closed:
			s.hold(key, v.models)
			later(v.state.RetryAt)
			continue
		}
		r := s.release.Reserve()
		d := r.Delay()
		if d > s.cfg.Interval { // the rest in the next round, at the same rate
			r.Cancel()
			complete = false
			break
		}
		select {
		case <-ctx.Done():
			return next, nil
		case <-time.After(d):
		}
		s.sweep(ctx, t, rd, true)
		released++
	}
	if !complete {
		later(now.Add(s.cfg.Interval))
	}
	for key, v := range views {
		if v.state.Closed && complete {
			s.mu.Lock()
			delete(s.held, key)
			s.mu.Unlock()
		}
		if v.probed { // its tasks come due again if the probe's nudge goes unanswered
			later(now.Add(s.cfg.BackoffBase))
		}
	}
	if released > 0 {
		s.log.InfoContext(ctx, "parked tasks released", "released", released)
	}
	if unknown != nil {
		return next, errors.Join(rd.unpublished, fmt.Errorf("breakers of parked tasks: %w", unknown))
	}
	return next, rd.unpublished
}
