package worker

import (
	"context"
	"sync"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Local takes the due tasks this instance's sweeper finds, while the instance consumes
// gemini-tasks: each is handled as its message would be (claimed from the document, run, acked
// to nobody), without going through Pub/Sub. A message the leader publishes can be lost for a
// while — handed to a process that then died, it waits out its ack deadline; the Pub/Sub
// emulator keeps routing new messages to a killed subscriber's stream — and Local is what lets
// the leader carry what it finds due whoever crashed. It takes at most limit tasks at once.
type Local struct {
	h   *Handler
	sem chan struct{}

	mu  sync.Mutex
	ctx context.Context // the consuming context; nil when not consuming
	wg  sync.WaitGroup
}

var _ sweeper.Local = (*Local)(nil)

// NewLocal returns a Local that runs at most limit tasks at once through h.
func NewLocal(h *Handler, limit int) *Local {
	return &Local{h: h, sem: make(chan struct{}, max(limit, 1))}
}

// Offer handles the task in this instance if it is consuming and has room, and reports whether
// it did. It never waits.
func (l *Local) Offer(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil || l.ctx.Err() != nil {
		return false
	}
	select {
	case l.sem <- struct{}{}:
	default:
		return false
	}
	ctx := l.ctx
	l.wg.Go(func() {
		defer func() { <-l.sem }()
		l.h.Handle(ctx, &bus.Message{ID: "local", Attributes: map[string]string{task.AttrTaskID: id}})
	})
	return true
}

// Run accepts offers until ctx ends, then waits for the tasks it took, which end as the pull
// consumer's do: they finish, or give up when the Handler is aborted.
func (l *Local) Run(ctx context.Context) {
	l.mu.Lock()
	l.ctx = ctx
	l.mu.Unlock()
	<-ctx.Done()
	l.mu.Lock()
	l.ctx = nil
	l.mu.Unlock()
	l.wg.Wait()
}
