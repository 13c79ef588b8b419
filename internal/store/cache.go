package store

import (
	"context"
	"sync"
	"time"
)

// Cache keeps a value per key — a tenant's limits, its webhook secrets — for a refresh period,
// so that a hot path does not read the same document for every task. One caller at a time reads
// a key: while it re-reads a stale entry the others are served the value it replaces, and while
// it reads a key for the first time the others wait for its answer, so an expiry costs one read,
// not one per task in flight. A failed re-read keeps the last value. Safe for concurrent use.
type Cache[V any] struct {
	read    func(ctx context.Context, key string) (V, error)
	refresh time.Duration
	now     func() time.Time

	mu sync.Mutex
	m  map[string]*cacheEntry[V]
}

type cacheEntry[V any] struct {
	v      V
	err    error         // of the first read, when it failed
	readAt time.Time     // zero until the first read answered
	busy   bool          // a caller is reading the key
	first  chan struct{} // closed when the first read answered
}

// NewCache returns a Cache that reads a key with read at most once every refresh.
func NewCache[V any](refresh time.Duration, read func(ctx context.Context, key string) (V, error)) *Cache[V] {
	return &Cache[V]{read: read, refresh: refresh, now: time.Now, m: map[string]*cacheEntry[V]{}}
}

// Get returns key's value: the cached one while it is fresh or another caller re-reads it, else
// a new read; the last one when that read fails.
func (c *Cache[V]) Get(ctx context.Context, key string) (V, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.m[key]
	switch {
	case !ok || e.readAt.IsZero() && !e.busy: // never read, or the first read failed
		e = &cacheEntry[V]{busy: true, first: make(chan struct{})}
		c.m[key] = e
	case e.readAt.IsZero(): // the first read is under way
		c.mu.Unlock()
		select {
		case <-e.first:
		case <-ctx.Done():
			var zero V
			return zero, ctx.Err()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return e.v, e.err
	case now.Sub(e.readAt) < c.refresh || e.busy:
		defer c.mu.Unlock()
		return e.v, nil
	default:
		e.busy = true
	}
	c.mu.Unlock()

	v, err := c.read(ctx, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	e.busy = false
	first := e.readAt.IsZero()
	switch {
	case err == nil:
		e.v, e.err, e.readAt = v, nil, now
	case first:
		e.err = err
	default:
		v = e.v // the last value stands
	}
	if first {
		close(e.first)
		return v, err
	}
	return v, nil
}
