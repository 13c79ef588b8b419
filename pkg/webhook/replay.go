package webhook

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// ErrReplayed is Guard.Check's answer for a delivery that verifies but whose webhook-id was
// accepted before and is still remembered: a captured request sent again, or genbox's own retry
// after the receiver's earlier 2xx was lost. Answer it 2xx and do not act on it again.
var ErrReplayed = errors.New("webhook: webhook-id already accepted")

// SeenStore remembers the webhook ids a receiver has accepted. The in-memory MemorySeen holds
// for one process; a store shared by every instance of a receiver (a database table with a
// unique key, Redis SET NX with an expiry) makes the guard hold across them.
type SeenStore interface {
	// MarkSeen records id for at least ttl and reports whether it was already recorded (and
	// not yet forgotten). Two concurrent calls for one id must not both report false.
	MarkSeen(ctx context.Context, id string, ttl time.Duration) (seen bool, err error)
	// Forget removes id, so that a delivery the receiver failed to act on is accepted when it
	// is sent again.
	Forget(ctx context.Context, id string) error
}

// Guard verifies a delivery and refuses a webhook-id it has accepted before. A zero Remember
// means twice the verifier's tolerance: long enough that a captured request is refused as a
// replay until its timestamp is too old anyway. To also recognise genbox's own retries of a
// delivery (same webhook-id, a fresh timestamp, for up to a day by default), remember ids for
// the sender's delivery horizon in a shared store.
type Guard struct {
	Verifier *Verifier
	Seen     SeenStore
	Remember time.Duration
}

// NewGuard returns a Guard of v over seen (nil: a MemorySeen of DefaultSeenIDs ids).
func NewGuard(v *Verifier, seen SeenStore) *Guard {
	if seen == nil {
		seen = NewMemorySeen(DefaultSeenIDs)
	}
	return &Guard{Verifier: v, Seen: seen}
}

// Check verifies the delivery (Verifier.Verify) and then records its webhook-id: nil for a
// first delivery, ErrReplayed (wrapped) for one accepted before, or the verification's error.
// Only verified ids are recorded, so forged requests cannot fill the store. A receiver that
// fails to act on a delivery it was given nil for calls Forget with its id.
func (g *Guard) Check(ctx context.Context, body []byte, h http.Header) error {
	if err := g.Verifier.Verify(body, h); err != nil {
		return err
	}
	remember := g.Remember
	if remember <= 0 {
		remember = 2 * g.Verifier.tolerance()
	}
	id := h.Get(HeaderID)
	seen, err := g.Seen.MarkSeen(ctx, id, remember)
	if err != nil {
		return fmt.Errorf("webhook: remember %s: %w", id, err)
	}
	if seen {
		return fmt.Errorf("%w: %s", ErrReplayed, id)
	}
	return nil
}

// Forget lets a delivery with id be accepted again: call it when acting on it failed.
func (g *Guard) Forget(ctx context.Context, id string) error { return g.Seen.Forget(ctx, id) }

// DefaultSeenIDs bounds the ids NewGuard's MemorySeen remembers.
const DefaultSeenIDs = 100_000

// MemorySeen is an in-memory SeenStore of at most a fixed number of ids: past it, the least
// recently marked id is forgotten first (a replay of it is then accepted, which the bound
// trades for memory). Its zero Now is the wall clock. Safe for concurrent use.
type MemorySeen struct {
	Now func() time.Time

	mu  sync.Mutex
	ids *lru[struct{}]
}

var _ SeenStore = (*MemorySeen)(nil)

// NewMemorySeen returns a MemorySeen of at most maxIDs ids (at least 1).
func NewMemorySeen(maxIDs int) *MemorySeen {
	return &MemorySeen{ids: newLRU[struct{}](maxIDs)}
}

// MarkSeen implements SeenStore.
func (m *MemorySeen) MarkSeen(_ context.Context, id string, ttl time.Duration) (bool, error) {
	now := time.Now()
	if m.Now != nil {
		now = m.Now()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, seen := m.ids.get(id, now)
	m.ids.put(id, struct{}{}, now.Add(ttl))
	return seen, nil
}

// Forget implements SeenStore.
func (m *MemorySeen) Forget(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ids.remove(id)
	return nil
}

// Len returns how many ids are remembered, expired ones included until they are evicted.
func (m *MemorySeen) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ids.len()
}

// lru is a bounded map whose least recently put entry goes first, each entry valid until its
// own time. Not safe for concurrent use.
type lru[V any] struct {
	max   int
	order *list.List // of *lruEntry[V], most recent first
	byKey map[string]*list.Element
}

type lruEntry[V any] struct {
	key   string
	val   V
	until time.Time // zero: no expiry
}

func newLRU[V any](maxEntries int) *lru[V] {
	return &lru[V]{max: max(maxEntries, 1), order: list.New(), byKey: map[string]*list.Element{}}
}

// get returns key's value unless it is missing or expired at now.
func (l *lru[V]) get(key string, now time.Time) (V, bool) {
	var zero V
	el, ok := l.byKey[key]
	if !ok {
		return zero, false
	}
	e := el.Value.(*lruEntry[V])
	if !e.until.IsZero() && now.After(e.until) {
		return zero, false
	}
	return e.val, true
}

// put sets key's value and validity and makes it the most recent, evicting the least recent
// entries past the bound.
func (l *lru[V]) put(key string, val V, until time.Time) {
	if el, ok := l.byKey[key]; ok {
		el.Value = &lruEntry[V]{key: key, val: val, until: until}
		l.order.MoveToFront(el)
		return
	}
	l.byKey[key] = l.order.PushFront(&lruEntry[V]{key: key, val: val, until: until})
	for l.order.Len() > l.max {
		l.remove(l.order.Back().Value.(*lruEntry[V]).key)
	}
}

func (l *lru[V]) remove(key string) {
	if el, ok := l.byKey[key]; ok {
		l.order.Remove(el)
		delete(l.byKey, key)
	}
}

func (l *lru[V]) len() int { return l.order.Len() }
