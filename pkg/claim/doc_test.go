package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/claim"
)

// Owners racing for one lease document: exactly one holds it, the others are told it is held.
func TestDocOneHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fs := testenv.Firestore(t, emulator.ProjectID(t))
	ref := fs.Collection("leaders").Doc("race")
	const owners = 6
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []string
	for i := range owners {
		wg.Go(func() {
			d := &claim.Doc{FS: fs, Ref: ref, Owner: fmt.Sprint("o", i), TTL: time.Minute}
			_, err := d.Acquire(ctx)
			switch {
			case err == nil:
				mu.Lock()
				held = append(held, d.Owner)
				mu.Unlock()
			case !errors.Is(err, claim.ErrHeld):
				t.Errorf("%s: %v", d.Owner, err)
			}
		})
	}
	wg.Wait()
	l, err := (&claim.Doc{FS: fs, Ref: ref}).Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || l.Owner != held[0] || l.Epoch != 1 {
		t.Fatalf("holders %v, stored lease %+v; want one holder at epoch 1", held, l)
	}
	// An expired lease is taken over with a higher epoch.
	now := time.Now().Add(2 * time.Minute)
	late := &claim.Doc{FS: fs, Ref: ref, Owner: "late", TTL: time.Minute, Now: func() time.Time { return now }}
	if l, err := late.Acquire(ctx); err != nil || l.Epoch != 2 {
		t.Fatalf("takeover after expiry: %+v %v", l, err)
	}
}
