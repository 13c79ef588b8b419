package sweeper

import (
	"context"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/obs"
)

// Option configures a Sweeper.
type Option func(*Sweeper)

// WithMetrics makes the leader report the backlog gauges in m after each pass: the age of the
// oldest pending work (genbox.pending.oldest_age) and the open dead letters by stage
// (genbox.dead_letters.open), both read from Firestore, so they survive restarts and a change
// of leader.
func WithMetrics(m *obs.Metrics) Option {
	return func(s *Sweeper) { s.gauges = &gauges{m: m} }
}

// gauges is what the leader last read for the backlog gauges.
type gauges struct {
	m *obs.Metrics

	mu      sync.Mutex
	since   time.Time // pending_since of the oldest pending task
	pending bool      // something is pending
	readAt  time.Time // when the leader last read it; zero when this instance does not lead
}

// observe reads the backlog after a leader's pass and records it.
func (s *Sweeper) observe(ctx context.Context) {
	g := s.gauges
	if g == nil {
		return
	}
	since, pending, err := s.store.OldestPending(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "oldest pending not read", "error", err)
	} else {
		g.mu.Lock()
		g.since, g.pending, g.readAt = since, pending, s.store.Now()
		g.mu.Unlock()
	}
	open, err := s.store.OpenDeadLetters(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "open dead letters not counted", "error", err)
		return
	}
	for stage, n := range open {
		g.m.DeadLettersOpen(ctx, stage, n)
	}
}

// oldestPending feeds genbox.pending.oldest_age at each collection: only a leader whose reading
// is fresh (within the leadership lease) reports, so instances never report stale ages.
func (s *Sweeper) oldestPending(context.Context) (time.Duration, bool) {
	g := s.gauges
	g.mu.Lock()
	defer g.mu.Unlock()
	now := s.store.Now()
	if !g.pending || g.readAt.IsZero() || now.Sub(g.readAt) > s.cfg.LeaderTTL {
		return 0, false
	}
	return max(now.Sub(g.since), 0), true
}

// registerGauges registers the pending-age callback while Run runs.
func (s *Sweeper) registerGauges(ctx context.Context) func() {
	if s.gauges == nil {
		return func() {}
	}
	unregister, err := s.gauges.m.ObservePendingAge(s.oldestPending)
	if err != nil {
		s.log.WarnContext(ctx, "pending age gauge not registered", "error", err)
		return func() {}
	}
	return func() { _ = unregister() }
}
