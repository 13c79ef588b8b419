package doubles

import (
	"context"
	"sync"
)

// record is an append-only list that can be waited on: what the Receiver and the Slack double
// received.
type record[T any] struct {
	mu      sync.Mutex
	items   []T
	changed chan struct{} // closed and replaced on every add
}

func (r *record[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, v)
	if r.changed != nil {
		close(r.changed)
	}
	r.changed = make(chan struct{})
}

// all returns the items so far, in order.
func (r *record[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.items...)
}

// wait returns the first item match accepts, waiting for it until ctx ends.
func (r *record[T]) wait(ctx context.Context, match func(T) bool) (T, error) {
	seen := 0
	for {
		r.mu.Lock()
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		got, changed := r.items[seen:], r.changed
		seen = len(r.items)
		r.mu.Unlock()
		for _, v := range got {
			if match(v) {
				return v, nil
			}
		}
		select {
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		case <-changed:
		}
	}
}
