package gemini

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// BreakerState is the state of a model's circuit breaker.
type BreakerState string

// Breaker states.
const (
	// BreakerClosed lets every call through.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen skips the model until its cooldown has passed.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen lets one probe call through; its outcome closes or reopens the breaker.
	BreakerHalfOpen BreakerState = "half_open"
)

// BreakerChange is one state change of a model's breaker, as stored in breakers/{model}.
type BreakerChange struct {
	Model  string
	From   BreakerState
	To     BreakerState
	At     time.Time
	Reason string
	// RetryAt is when the new state may end without an outcome: an open breaker lets a probe
	// through then, and a half-open one whose probe has not answered by then (its instance died)
	// lets another instance take the probe over. Zero when To is closed.
	RetryAt time.Time
	// Generation numbers the breaker's states: each change raises it by one. Instances that share
	// their breakers (BreakerStore) apply a change only over the generation it was made from, so
	// changes made concurrently or delivered late never overwrite a newer state.
	Generation int64
}

// BreakerStatus is a model's breaker as stored by whichever instance changed it last: what
// every instance adopts (Client.ObserveBreaker) when it is newer than its own.
type BreakerStatus struct {
	Model      string
	State      BreakerState
	Generation int64
	Since      time.Time
	RetryAt    time.Time // as in BreakerChange
}

// ErrBreakerMoved is what a BreakerStore answers for a change made from a generation that is no
// longer the stored one: another instance changed the breaker first.
var ErrBreakerMoved = errors.New("gemini: the breaker was changed by another instance")

// BreakerStore records breaker state changes and shares them between instances: the sweeper
// leaves parked tasks alone until a chain closes, and every instance follows one breaker per
// model, so that N instances in an outage spend the probes of one. It is called only when a
// breaker changes state.
type BreakerStore interface {
	// SaveBreaker records ch if the stored breaker of ch.Model is at generation ch.Generation-1
	// (a model never stored is at 0); otherwise it writes nothing and returns ErrBreakerMoved.
	SaveBreaker(ctx context.Context, ch BreakerChange) error
}

type outcome int

const (
	outcomeSuccess outcome = iota // the model answered
	outcomeFailure                // 429, 5xx or a network failure
	outcomeNeutral                // the request's own fault (4xx): says nothing about the model
)

type sample struct {
	at     time.Time
	failed bool
}

// breaker is one model's circuit breaker: open on ConsecutiveFailures in a row or on more than
// FailureRatio failing in Window (at least MinVolume calls); after Cooldown one probe passes.
// Every call carries the generation that allowed it, and its outcome counts only while that
// generation lasts: a late answer to a call made before the breaker moved says nothing about the
// probe that moved it since.
type breaker struct {
	model string
	cfg   BreakerConfig

	mu          sync.Mutex
	state       BreakerState
	gen         int64
	consecutive int
	window      []sample
	retryAt     time.Time // open: a probe may pass from then; half-open: the probe in flight is presumed lost then
	probing     bool      // half-open: this instance's probe is in flight
	elsewhere   bool      // half-open: another instance's probe is in flight until retryAt
}

func newBreaker(model string, cfg BreakerConfig) *breaker {
	return &breaker{model: model, cfg: cfg, state: BreakerClosed}
}

// allow reports whether a call may go to the model now, with the generation its outcome is to be
// recorded under. An open breaker past its cooldown turns half-open and lets exactly one probe
// through until that probe's outcome is recorded; so does a half-open one whose probe, made
// elsewhere, is overdue. A change it returns must be saved before the probe is made: when
// another instance moved the breaker first, the probe is not made (moved).
func (b *breaker) allow(now time.Time) (bool, int64, *BreakerChange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, b.gen, nil
	case BreakerOpen:
		if now.Before(b.retryAt) {
			return false, b.gen, nil
		}
		b.probing = true
		ch := b.move(BreakerHalfOpen, now, "cooldown passed: probing")
		return true, b.gen, ch
	default: // half-open
		switch {
		case b.probing, b.elsewhere && now.Before(b.retryAt):
			return false, b.gen, nil
		case b.elsewhere:
			b.probing = true
			ch := b.move(BreakerHalfOpen, now, "the probe in flight elsewhere is overdue: probing")
			return true, b.gen, ch
		}
		b.probing = true // the previous probe said nothing (neutral): probe again
		return true, b.gen, nil
	}
}

// available reports whether a call could pass now: the breaker is closed, open past its cooldown,
// or half-open with no probe in flight (none of this instance's, nor another's still due).
func (b *breaker) available(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerOpen:
		return !now.Before(b.retryAt)
	}
	return !b.probing && (!b.elsewhere || !now.Before(b.retryAt))
}

// nextCall is when a call may pass at the earliest: now for an available breaker, else the end of
// its cooldown or of the probe in flight.
func (b *breaker) nextCall(now time.Time) time.Time {
	if b.available(now) {
		return now
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.probing { // this instance's probe answers within its own call
		return now
	}
	return b.retryAt
}

// record takes the outcome of a call that allow let through under generation gen. The outcome
// of an older generation is dropped.
func (b *breaker) record(now time.Time, gen int64, o outcome) *BreakerChange {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen != b.gen {
		return nil
	}
	wasProbe := b.state == BreakerHalfOpen && b.probing
	b.probing = false
	if o == outcomeNeutral {
		return nil
	}
	failed := o == outcomeFailure
	b.window = append(b.window, sample{at: now, failed: failed})
	b.trim(now)
	if !failed {
		b.consecutive = 0
		if wasProbe {
			b.window = b.window[:0]
			return b.move(BreakerClosed, now, "probe succeeded")
		}
		return nil
	}
	b.consecutive++
	switch {
	case wasProbe:
		return b.move(BreakerOpen, now, "probe failed")
	case b.state != BreakerClosed:
		return nil
	case b.consecutive >= b.cfg.ConsecutiveFailures:
		return b.move(BreakerOpen, now, fmt.Sprintf("%d consecutive failures", b.consecutive))
	}
	if n, bad := b.counts(); n >= b.cfg.MinVolume && float64(bad) > b.cfg.FailureRatio*float64(n) {
		return b.move(BreakerOpen, now, fmt.Sprintf("%d of %d calls failed in %s", bad, n, b.cfg.Window))
	}
	return nil
}

// moved takes back the claim of ch, a change another instance beat: the breaker keeps its state
// but gives up a probe it had taken, and adopts the next stored state whatever its generation.
func (b *breaker) moved(ch *BreakerChange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen != ch.Generation {
		return
	}
	b.gen--
	if b.state == BreakerHalfOpen {
		b.probing, b.elsewhere = false, true
	}
}

// observe adopts a stored state newer than the breaker's own.
func (b *breaker) observe(st BreakerStatus) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st.Generation <= b.gen {
		return
	}
	b.gen, b.state, b.retryAt = st.Generation, st.State, st.RetryAt
	b.probing, b.elsewhere = false, st.State == BreakerHalfOpen
	if st.State == BreakerClosed {
		b.consecutive, b.window = 0, b.window[:0]
	}
}

func (b *breaker) move(to BreakerState, now time.Time, reason string) *BreakerChange {
	b.gen++
	ch := &BreakerChange{Model: b.model, From: b.state, To: to, At: now, Reason: reason, Generation: b.gen}
	b.state = to
	b.elsewhere = false
	b.retryAt = time.Time{}
	switch to {
	case BreakerOpen, BreakerHalfOpen:
		b.retryAt = now.Add(b.cfg.Cooldown)
		ch.RetryAt = b.retryAt
	case BreakerClosed:
		b.consecutive = 0
	}
	return ch
}

func (b *breaker) trim(now time.Time) {
	i := 0
	for i < len(b.window) && now.Sub(b.window[i].at) > b.cfg.Window {
		i++
	}
	b.window = b.window[i:]
}

func (b *breaker) counts() (n, bad int) {
	for _, s := range b.window {
		n++
		if s.failed {
			bad++
		}
	}
	return n, bad
}
