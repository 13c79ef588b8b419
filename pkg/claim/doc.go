package claim

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Doc is a lease kept in a document of its own (for example leaders/sweeper, the sweeper's
// leadership): every operation reads the document and writes it back only if it is unchanged, so
// two owners never both hold it.
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
// it when d.Owner already holds it. It returns the lease as stored, or ErrHeld. A write that
// loses to a concurrent one is reported as ErrHeld too: someone else won.
func (d *Doc) Acquire(ctx context.Context) (Lease, error) {
	return d.update(ctx, ErrHeld, func(l *Lease, now time.Time) error {
		if l.HeldBy(d.Owner, l.Epoch, now) {
			return l.Renew(d.Owner, l.Epoch, now, d.TTL)
		}
		return l.Take(d.Owner, now, d.TTL)
	})
}

// Renew extends the lease d.Owner holds at epoch, even one that lapsed while nobody took it
// over (Lease.Renew), or fails with ErrLeaseLost.
func (d *Doc) Renew(ctx context.Context, epoch int64) (Lease, error) {
	return d.update(ctx, ErrLeaseLost, func(l *Lease, now time.Time) error {
		return l.Renew(d.Owner, epoch, now, d.TTL)
	})
}

// Release frees the lease d.Owner holds at epoch, so the next owner need not wait for it to
// expire; it fails with ErrLeaseLost when someone else took it meanwhile.
func (d *Doc) Release(ctx context.Context, epoch int64) error {
	_, err := d.update(ctx, ErrLeaseLost, func(l *Lease, _ time.Time) error {
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

// update applies fn to the stored lease and writes it back only if the document has not changed
// since it was read (same update time, or still absent). It runs no transaction: a transaction
// holds its locks until it commits, so an owner killed between its read and its write would keep
// the document locked until Firestore expires the transaction (67 s on the emulator), and with
// it every other owner. A write that loses to a concurrent change fails with lost: someone else
// won.
func (d *Doc) update(ctx context.Context, lost error, fn func(l *Lease, now time.Time) error) (Lease, error) {
	var l Lease
	snap, err := d.Ref.Get(ctx)
	exists := status.Code(err) != codes.NotFound
	if exists {
		if err != nil {
			return Lease{}, fmt.Errorf("lease %s: %w", d.Ref.Path, err)
		}
		if err := snap.DataTo(&l); err != nil {
			return Lease{}, fmt.Errorf("decode lease %s: %w", d.Ref.Path, err)
		}
	}
	if err := fn(&l, d.now()); err != nil {
		return Lease{}, err
	}
	if exists {
		var expires any = firestore.Delete
		if l.ExpiresAt != nil {
			expires = *l.ExpiresAt
		}
		_, err = d.Ref.Update(ctx, []firestore.Update{{Path: "owner", Value: l.Owner}, {Path: "epoch", Value: l.Epoch},
			{Path: "expires_at", Value: expires}}, firestore.LastUpdateTime(snap.UpdateTime))
	} else {
		_, err = d.Ref.Create(ctx, l)
	}
	switch status.Code(err) {
	case codes.OK:
		return l, nil
	case codes.FailedPrecondition, codes.AlreadyExists:
		return Lease{}, fmt.Errorf("lease %s: %w (contended)", d.Ref.Path, lost)
	}
	return Lease{}, fmt.Errorf("lease %s: %w", d.Ref.Path, err)
}
