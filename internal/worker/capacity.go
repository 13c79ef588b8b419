package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/genbox-dev/genbox/internal/autoscale"
)

// capacity bounds a Handler's work at three points (WithCapacity): the tasks in hand — a message
// or a Local offer, from before its claim until its ack —, the tasks claimed or calling the
// model, and the model calls. A task holds a call slot only while its model call runs: it is
// claimed ahead of a free slot, within a small reserve (calls + reserve claimed or calling), and
// its output is persisted, its result nudged and its message acked after the slot is freed, so
// that no slot waits on Firestore or Pub/Sub. A claimed task waiting for a slot holds its lease,
// renewed as any other, and releases it when the instance stops taking work. A claimed task
// waiting for its tenant's rpm or tpm gives its call slot up meanwhile; at most reserve wait so.
type capacity struct {
	inHand   chan struct{}
	ahead    chan struct{}
	calls    chan struct{}
	claiming chan struct{} // claims under way
	rateWait chan struct{} // claimed tasks waiting in process for their tenant's rate

	served atomic.Int64 // model calls that have freed their slot
	busy   atomic.Int64 // nanoseconds those calls held their slot
}

// claimsAtOnce is how many claims of a Handler with calls model-call slots may be under way at
// once. A burst of messages (a backlog, a restart) would otherwise start a claim for every place
// among the claimed together, and a Firestore that serves them side by side — the emulator
// sharing two cores, an instance's own CPU marshalling them — finishes them all together, late:
// no call starts until then. A quarter of the slots at a time finishes the first claims first,
// and the calls start as they do; one claim per freed slot, the steady state, never waits here.
func claimsAtOnce(calls int) int { return max(4, calls/4) }

// WithCapacity bounds the handler's work (docs/architecture.md §4): calls model calls at once
// (GENBOX_CONCURRENCY), calls + reserve tasks claimed or calling (GENBOX_CLAIM_AHEAD), and
// inHand tasks in hand at once (GENBOX_MAX_IN_FLIGHT: the pull's flow control), counting those
// its Local takes. A message beyond them waits, unclaimed, and Local takes no more.
func WithCapacity(calls, reserve, inHand int) Option {
	return func(h *Handler) {
		calls = max(calls, 1)
		h.room = &capacity{inHand: make(chan struct{}, max(inHand, 1)), ahead: make(chan struct{}, calls+max(reserve, 0)),
			calls: make(chan struct{}, calls), claiming: make(chan struct{}, claimsAtOnce(calls)),
			rateWait: make(chan struct{}, max(reserve, 0))}
	}
}

// enter takes room for one more task in hand and for its claim, waiting for it until ctx ends
// when wait is set, and reports whether it got both. ctx is also what ends the task's wait for
// a model-call slot: the pull's or Local's context.
func (c *capacity) enter(ctx context.Context, wait bool) (*place, bool) {
	p := &place{c: c, stop: ctx}
	if c == nil {
		return p, true
	}
	for _, sem := range []chan struct{}{c.inHand, c.ahead} {
		if !take(ctx, sem, wait) {
			p.leave()
			return nil, false
		}
		p.held = append(p.held, sem)
	}
	return p, true
}

// take takes a place of sem, waiting for one until ctx ends when wait is set.
func take(ctx context.Context, sem chan struct{}, wait bool) bool {
	if !wait {
		select {
		case sem <- struct{}{}:
			return true
		default:
			return false
		}
	}
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// place is what one task holds of a Handler's capacity; on a Handler without one it holds
// nothing and never waits.
type place struct {
	c    *capacity
	stop context.Context // ends when the instance stops taking work: the pull's or Local's context

	mu      sync.Mutex
	held    []chan struct{} // in the order taken: inHand, ahead, calls
	calling time.Time       // when the call slot was taken
}

// claim runs fn, the task's claim, once fewer than claimsAtOnce claims are under way, and reports
// false without running it when the instance stops taking work first.
func (p *place) claim(fn func()) bool {
	if p.c == nil {
		fn()
		return true
	}
	if !take(p.stop, p.c.claiming, true) {
		return false
	}
	defer func() { <-p.c.claiming }()
	fn()
	return true
}

// startCall waits for a model-call slot until the instance stops taking work or ctx ends, and
// reports whether it got one.
func (p *place) startCall(ctx context.Context) bool {
	if p.c == nil {
		return true
	}
	select {
	case p.c.calls <- struct{}{}:
	case <-p.stop.Done():
		return false
	case <-ctx.Done():
		return false
	}
	p.mu.Lock()
	p.held = append(p.held, p.c.calls)
	p.calling = time.Now()
	p.mu.Unlock()
	return true
}

// endCall frees the task's call slot and its place among the claimed: what follows (persisting,
// publishing, acking, or any other write of the outcome) holds only its place in hand. It may be
// called more than once.
func (p *place) endCall() { p.free(1) }

// pauseCall frees the task's call slot, taken by startCall, without counting a call served: the
// task waits without calling, and startCall takes a slot again.
func (p *place) pauseCall() {
	if p.c == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.held); n > 0 && p.held[n-1] == p.c.calls {
		p.c.busy.Add(int64(time.Since(p.calling)))
		<-p.c.calls
		p.held = p.held[:n-1]
	}
}

// rateWait runs fn, in which the task may wait in process for its tenant's rate, if one of the
// instance's places for such waits is free (reporting true), and runs none otherwise: a
// Handler with a capacity lets as many claimed tasks wait so as it claims ahead of its call
// slots, so that they never keep the others from calling.
func (p *place) rateWait(fn func()) bool {
	if p.c == nil {
		fn()
		return true
	}
	if !take(p.stop, p.c.rateWait, false) {
		return false
	}
	defer func() { <-p.c.rateWait }()
	fn()
	return true
}

// leave frees everything the task holds. It may be called more than once.
func (p *place) leave() { p.free(0) }

// free releases what the task holds beyond the first keep of held.
func (p *place) free(keep int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.held) > keep {
		sem := p.held[len(p.held)-1]
		if sem == p.c.calls {
			p.c.served.Add(1)
			p.c.busy.Add(int64(time.Since(p.calling)))
		}
		<-sem
		p.held = p.held[:len(p.held)-1]
	}
}

// Load reports the handler's slots and the calls they served, which the autoscaler sizes the
// pool from; a Handler without WithCapacity reports the zero Load.
func (h *Handler) Load() autoscale.Load {
	c := h.room
	if c == nil {
		return autoscale.Load{}
	}
	return autoscale.Load{Slots: cap(c.calls), Calling: len(c.calls), Served: c.served.Load(), Busy: time.Duration(c.busy.Load())}
}
