package bus_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/genbox-dev/genbox/internal/bus"
)

// Of concurrent duplicates, one takes the key; once it is deleted, the next nudge takes it again,
// and other keys are never in the way.
func TestInHandTakesEachKeyOnce(t *testing.T) {
	t.Parallel()
	var g bus.InHand
	var took atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if g.Take("t1") {
				took.Add(1)
			}
		})
	}
	wg.Wait()
	if n := took.Load(); n != 1 {
		t.Fatalf("%d of 16 duplicates took t1, want 1", n)
	}
	if !g.Take("t2") {
		t.Error("t2 refused while only t1 is in hand")
	}
	g.Delete("t1")
	if !g.Take("t1") {
		t.Error("t1 refused after it was deleted")
	}
}
