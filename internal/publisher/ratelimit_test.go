package publisher

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
)

// Submissions of one tenant arrive together while its cached limits are due for a re-read: each
// request may re-read them, and none reads the cache entry another is refreshing without the
// lock (go test -race finds the data race there was on the entry's fetch time).
func TestLimitersRefreshConcurrently(t *testing.T) {
	t.Parallel()
	l := newLimiters(store.New(testenv.Firestore(t, emulator.ProjectID(t))), 0) // every call re-reads
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				if _, err := l.limiter(ctx, "acme", time.Now()); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
