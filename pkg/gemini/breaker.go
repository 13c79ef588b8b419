package gemini

import (
	"context"
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
	// RetryAt is when an open breaker lets a probe through; zero unless To is open.
	RetryAt time.Time
}

// BreakerStore records breaker state changes, so that the sweeper can leave parked tasks alone
// until a chain closes. It is called only when a breaker changes state.
type BreakerStore interface {
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
type breaker struct {
	model string
	cfg   BreakerConfig

	mu          sync.Mutex
	state       BreakerState
	consecutive int
	window      []sample
	openedAt    time.Time
	probing     bool
}

func newBreaker(model string, cfg BreakerConfig) *breaker {
	return &breaker{model: model, cfg: cfg, state: BreakerClosed}
}

// allow reports whether a call may go to the model now. An open breaker past its cooldown turns
// half-open and lets exactly one probe through until that probe's outcome is recorded.
func (b *breaker) allow(now time.Time) (bool, *BreakerChange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, nil
	case BreakerOpen:
		if now.Sub(b.openedAt) < b.cfg.Cooldown {
			return false, nil
		}
		b.probing = true
		return true, b.move(BreakerHalfOpen, now, "cooldown passed: probing")
	default: // half-open
		if b.probing {
			return false, nil
		}
		b.probing = true
		return true, nil
	}
}

// available reports whether a call could pass now or soon: the breaker is not open, or its
// cooldown has passed.
func (b *breaker) available(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state != BreakerOpen || now.Sub(b.openedAt) >= b.cfg.Cooldown
}

// record takes the outcome of a call that allow let through.
func (b *breaker) record(now time.Time, o outcome) *BreakerChange {
	b.mu.Lock()
	defer b.mu.Unlock()
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

func (b *breaker) move(to BreakerState, now time.Time, reason string) *BreakerChange {
	ch := &BreakerChange{Model: b.model, From: b.state, To: to, At: now, Reason: reason}
	b.state = to
	if to == BreakerOpen {
		b.openedAt = now
		ch.RetryAt = now.Add(b.cfg.Cooldown)
	}
	if to == BreakerClosed {
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
