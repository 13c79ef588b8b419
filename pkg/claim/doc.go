package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Doc is a lease kept in a document of its own (for example leaders/sweeper, the sweeper's
// leadership): every operation is one Firestore transaction, so two owners never both hold it.
// A lease inside a larger document (a task, a delivery) is changed with the Lease methods inside
// that document's own transaction instead.
type Doc struct {
	FS    *firestore.Client
	Ref   *firestore.DocumentRef
	Owner string
	TTL   time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Acquire takes the lease for d.Owner when it is free or expired (raising the epoch), or renews
// it when d.Owner already holds it. It returns the lease as stored, or ErrHeld. A transaction
// that loses to a concurrent one (codes.Aborted) is reported as ErrHeld too: someone else won.
func (d *Doc) Acquire(ctx context.Context) (Lease, error) {
	return d.update(ctx, func(l *Lease, now time.Time) error {
		if l.HeldBy(d.Owner, l.Epoch, now) {
			return l.Renew(d.Owner, l.Epoch, now, d.TTL)
		}
		return l.Take(d.Owner, now, d.TTL)
	})
}

// Renew extends the lease d.Owner holds at epoch, or fails with ErrLeaseLost.
func (d *Doc) Renew(ctx context.Context, epoch int64) (Lease, error) {
	return d.update(ctx, func(l *Lease, now time.Time) error {
		return l.Renew(d.Owner, epoch, now, d.TTL)
	})
}

// Release frees the lease d.Owner holds at epoch, so the next owner need not wait for it to
// expire; it fails with ErrLeaseLost when someone else took it meanwhile.
func (d *Doc) Release(ctx context.Context, epoch int64) error {
	_, err := d.update(ctx, func(l *Lease, _ time.Time) error {
		return l.Release(d.Owner, epoch)
	})
	return err
}

// Get reads the lease as stored; a missing document is the zero (free) Lease.
func (d *Doc) Get(ctx context.Context) (Lease, error) {
	var l Lease
	snap, err := d.Ref.Get(ctx)
	if status.Code(err) == codes.NotFound {
		return l, nil
	}
	if err != nil {
		return l, fmt.Errorf("read lease %s: %w", d.Ref.Path, err)
	}
	if err := snap.DataTo(&l); err != nil {
		return l, fmt.Errorf("decode lease %s: %w", d.Ref.Path, err)
	}
	return l, nil
}

func (d *Doc) now() time.Time {
	if d.Now != nil {
		return d.Now().UTC()
	}
	return time.Now().UTC()
}

// update applies fn to the stored lease in one transaction and writes it back when fn succeeds.
func (d *Doc) update(ctx context.Context, fn func(l *Lease, now time.Time) error) (Lease, error) {
	var out Lease
	err := d.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		var l Lease
		snap, err := tx.Get(d.Ref)
		switch {
		case status.Code(err) == codes.NotFound:
		case err != nil:
			return err
		default:
			if err := snap.DataTo(&l); err != nil {
				return fmt.Errorf("decode lease: %w", err)
			}
		}
		if err := fn(&l, d.now()); err != nil {
			return err
		}
		out = l
		return tx.Set(d.Ref, l)
	}, firestore.MaxAttempts(2))
	switch {
	case err == nil:
		return out, nil
	case errors.Is(err, ErrHeld), errors.Is(err, ErrLeaseLost):
		return out, err
	case status.Code(err) == codes.Aborted:
		return out, fmt.Errorf("lease %s: %w (contended)", d.Ref.Path, ErrHeld)
	}
	return out, fmt.Errorf("lease %s: %w", d.Ref.Path, err)
}
