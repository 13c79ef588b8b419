package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// However many tasks ask at once, a key is read once when first asked for and once when its
// entry expires (the others get the value being replaced meanwhile), and a failed re-read keeps
// the last value.
func TestCacheReadsOncePerExpiry(t *testing.T) {
	t.Parallel()
	var reads atomic.Int64
	release := make(chan struct{})
	fail := atomic.Bool{}
	c := NewCache(time.Minute, func(_ context.Context, key string) (int64, error) {
		n := reads.Add(1)
		<-release
		if fail.Load() {
			return 0, errors.New("unavailable")
		}
		return n, nil
	})
	now := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return now }
	ctx := context.Background()

	getAll := func(n int) []int64 {
		out := make([]int64, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				v, err := c.Get(ctx, "acme")
				if err != nil {
					t.Error(err)
				}
				out[i] = v
			})
		}
		return func() []int64 {
			time.Sleep(50 * time.Millisecond) // every caller is waiting or served
			close(release)
			wg.Wait()
			release = make(chan struct{})
			return out
		}()
	}
	for _, v := range getAll(16) {
		if v != 1 {
			t.Fatalf("first read: got %d, want 1", v)
		}
	}
	now = now.Add(2 * time.Minute)
	got := getAll(16)
	if reads.Load() != 2 {
		t.Fatalf("%d reads for one expiry, want 2 in all", reads.Load())
	}
	var fresh int
	for _, v := range got {
		if v == 2 {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d callers got the re-read value, want only the one that read (the rest get the last): %v", fresh, got)
	}
	fail.Store(true)
	now = now.Add(2 * time.Minute)
	close(release)
	if v, err := c.Get(ctx, "acme"); err != nil || v != 2 {
		t.Errorf("failed re-read: got %d, %v; want the last value 2", v, err)
	}
}
