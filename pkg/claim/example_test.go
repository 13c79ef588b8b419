package claim_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/pkg/claim"
)

// A leader lease in its own document: the first owner takes it (epoch 1), a second owner is
// refused while it is live, and takes it over (epoch 2) once the first releases it; the first
// owner's stale epoch can then no longer renew.
func ExampleDoc() {
	ctx := context.Background()
	fs, err := firestore.NewClient(ctx, fmt.Sprintf("example-claim-%d", time.Now().UnixNano()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer fs.Close()
	ref := fs.Collection("leaders").Doc("sweeper")
	a := &claim.Doc{FS: fs, Ref: ref, Owner: "worker-a", TTL: time.Minute}
	b := &claim.Doc{FS: fs, Ref: ref, Owner: "worker-b", TTL: time.Minute}

	la, _ := a.Acquire(ctx)
	fmt.Println("a holds epoch", la.Epoch)
	_, err = b.Acquire(ctx)
	fmt.Println("b refused:", errors.Is(err, claim.ErrHeld))
	fmt.Println("a releases:", a.Release(ctx, la.Epoch))
	lb, _ := b.Acquire(ctx)
	fmt.Println("b holds epoch", lb.Epoch)
	_, err = a.Renew(ctx, la.Epoch)
	fmt.Println("a's stale renewal:", err)
	// Output:
	// a holds epoch 1
	// b refused: true
	// a releases: <nil>
	// b holds epoch 2
	// a's stale renewal: claim: lease lost
}

// The fencing rule of a lease kept inside a task document: a takeover after expiry raises the
// epoch, and the old holder can neither renew nor release any more.
func ExampleLease() {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var l claim.Lease
	_ = l.Take("worker-a", t0, 30*time.Second)
	fmt.Println(l.Owner, l.Epoch, l.Live(t0.Add(10*time.Second)))
	fmt.Println("expired at +30s:", l.Expired(t0.Add(30*time.Second)))
	_ = l.Take("worker-b", t0.Add(31*time.Second), 30*time.Second)
	fmt.Println(l.Owner, l.Epoch)
	fmt.Println(l.Renew("worker-a", 1, t0.Add(32*time.Second), time.Minute))
	fmt.Println(l.Release("worker-a", 1))
	// Output:
	// worker-a 1 true
	// expired at +30s: true
	// worker-b 2
	// claim: lease lost
	// claim: lease lost
}
