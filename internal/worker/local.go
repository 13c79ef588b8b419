package worker

import (
	"context"
	"sync"

	"github.com/genbox-dev/genbox/internal/protocol"
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
// It also runs the tasks h claims with a slot their tenant's ending task handed over.
func NewLocal(h *Handler) *Local {
	l := &Local{h: h}
	h.local = l
	return l
}

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
		h.handle(ctx, log, id, "", p)
	})
	return true
}

// consuming reports whether the instance takes work.
func (l *Local) consuming() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctx != nil && l.ctx.Err() == nil
}

// adopt runs t, which this instance has just claimed with a slot of its tenant (slots.go), as an
// offer would, once there is room for it; it reports false, leaving t to the caller to release,
// when the instance takes no more work. Its lease is renewed while it waits for room: it waits
// behind every message in hand, and a lease lapsed there is a second generation elsewhere.
func (l *Local) adopt(t *protocol.Task) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil || l.ctx.Err() != nil {
		return false
	}
	h, ctx := l.h, l.ctx
	l.wg.Go(func() {
		log := h.log.With("task_id", t.ID, "delivery_attempt", 0)
		last := &lastWrite{t: t}
		stopRenewal := h.keepLease(ctx, func(error) {}, log, last, t.Lease.Epoch)
		p, ok := h.room.enter(ctx, true)
		stopRenewal()
		t := last.get()
		if !ok {
			log.InfoContext(ctx, "stopped taking work before a task handed a slot had room; released")
			h.runOf(log, t, nil).release(ctx)
			return
		}
		defer p.leave()
		h.inHand.Take(t.ID) // claimed with its slot: a nudge for it is acked from here on
		defer h.inHand.Delete(t.ID)
		work, stop := context.WithCancel(context.WithoutCancel(ctx))
		defer stop()
		defer context.AfterFunc(h.abort, stop)()
		h.runClaimed(work, log, t, p)
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
