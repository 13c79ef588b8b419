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

// A lease written by someone else between an owner's read and its write is not overwritten: the
// owner is told the lease is held. (The clock runs between the two, so it stages the rival.)
func TestDocWriteLosesToAChangeSinceItsRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fs := testenv.Firestore(t, emulator.ProjectID(t))
	ref := fs.Collection("leaders").Doc("raced")
	rival := &claim.Doc{FS: fs, Ref: ref, Owner: "rival", TTL: time.Minute}
	for _, existing := range []bool{false, true} {
		if existing {
			if _, err := rival.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
			if err := rival.Release(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		staged := false
		d := &claim.Doc{FS: fs, Ref: ref, Owner: "slow", TTL: time.Minute, Now: func() time.Time {
			if !staged {
				staged = true
				if _, err := rival.Acquire(ctx); err != nil {
					t.Fatal(err)
				}
			}
			return time.Now()
		}}
		if _, err := d.Acquire(ctx); !errors.Is(err, claim.ErrHeld) {
			t.Fatalf("document existed %v: acquire after a rival's write answered %v, want ErrHeld", existing, err)
		}
		l, err := d.Get(ctx)
		if err != nil || l.Owner != "rival" {
			t.Fatalf("document existed %v: stored lease %+v %v, want the rival's", existing, l, err)
		}
		if _, err := ref.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Renew and Release report a write that loses to a change since their read as ErrLeaseLost, as
// they do a lease taken over: the caller's epoch may no longer be the stored one.
func TestDocRenewAndReleaseLoseAsLeaseLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fs := testenv.Firestore(t, emulator.ProjectID(t))
	ref := fs.Collection("leaders").Doc("renewed")
	other := &claim.Doc{FS: fs, Ref: ref, Owner: "me", TTL: time.Minute} // the same owner elsewhere
	l, err := other.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	staged := false
	d := &claim.Doc{FS: fs, Ref: ref, Owner: "me", TTL: time.Minute, Now: func() time.Time {
		if !staged {
			staged = true
			if _, err := other.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return time.Now()
	}}
	if _, err := d.Renew(ctx, l.Epoch); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("renew after a change since its read: %v, want ErrLeaseLost", err)
	}
	staged = false
	if err := d.Release(ctx, l.Epoch); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("release after a change since its read: %v, want ErrLeaseLost", err)
	}
}
