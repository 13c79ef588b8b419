package worker

import (
	"context"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/service"
)

// Lifecycle is the worker as service.Run runs it, in its process and in the dev stack alike:
// Consume of ps into h (Handler, or a wrapper of it) with Background beside it; readiness checks
// Firestore and the pull; calls that outlive Config.ShutdownGrace release their lease. In an
// autoscaled pool the pull stops while the pool drains (autoscale.Member).
func (a *Assembly) Lifecycle(ps *pubsub.Client, h bus.Handler) service.Lifecycle {
	pull := func(ctx context.Context) error { return a.Consume(ctx, ps, h) }
	if a.gate != nil {
		pull = a.gate(pull)
	}
	return service.Lifecycle{
		Ready:      a.ready,
		Grace:      a.grace,
		Pull:       pull,
		Abort:      a.Handler.Abort,
		Background: a.Background,
		Started:    a.started,
	}
}
