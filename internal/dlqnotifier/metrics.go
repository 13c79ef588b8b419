package dlqnotifier

import (
	"context"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Option configures a Service.
type Option func(*Service)

// WithMetrics counts the task transitions a decision makes (genbox.tasks): a regenerated task
// queued again, a dead generation discarded.
func WithMetrics(m *obs.Metrics) Option { return func(s *Service) { s.metrics = m } }

// countDecision records the state a decision moved t into, if it moved it.
func (s *Service) countDecision(ctx context.Context, t *protocol.Task, action Action) {
	switch {
	case t == nil:
	case action == ActionRegenerate && t.State == task.StateQueued:
		s.metrics.TaskState(ctx, t.Family, t.State)
	case action == ActionDiscard && t.State == task.StateDiscarded:
		var e2e time.Duration
		if t.CompletedAt != nil {
			e2e = t.CompletedAt.Sub(t.CreatedAt)
		}
		s.metrics.TaskFinished(ctx, t.Family, t.State, e2e)
	}
}
