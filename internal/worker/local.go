package worker

import (
	"context"
	"sync"

	"github.com/genbox-dev/genbox/internal/sweeper"
)

// Local takes the due tasks this instance's sweeper finds, while the instance consumes
// gemini-tasks: each is handled as its message would be (claimed from the document, run, acked
// to nobody), without going through Pub/Sub. A message the leader publishes can be lost for a
// while — handed to a process that then died, it waits out its ack deadline; the Pub/Sub
// emulator keeps routing new messages to a killed subscriber's stream — and Local is what lets
// the leader carry what it finds due whoever crashed. It takes a task only while the Handler has
// room to claim it (WithCapacity).
type Local struct {
	h *Handler

	mu  sync.Mutex
	ctx context.Context // the consuming context; nil when not consuming
	wg  sync.WaitGroup
}

var _ sweeper.Local = (*Local)(nil)

// NewLocal returns a Local that runs tasks through h.
func NewLocal(h *Handler) *Local { return &Local{h: h} }

// Offer handles the task in this instance if it is consuming and has room to claim it, and
// reports whether it did. It never waits.
func (l *Local) Offer(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil || l.ctx.Err() != nil {
		return false
	}
	h, ctx := l.h, l.ctx
	p, ok := h.room.enter(ctx, false)
	if !ok {
		return false
	}
	l.wg.Go(func() {
		defer p.leave()
		log := h.log.With("task_id", id, "delivery_attempt", 0)
		if !h.takeInHand(ctx, log, id) {
			return
		}
		defer h.inHand.Delete(id)
		h.handle(ctx, log, id, p)
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
