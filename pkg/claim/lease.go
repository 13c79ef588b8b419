// Package claim owns leases kept in Firestore documents: who holds a piece of work, until when,
// and a fencing epoch that rises on every claim, so that a writer whose lease was taken over can
// be refused. Task claims and webhook delivery claims use the same Lease.
package claim

import (
	"errors"
	"time"
)

// Sentinel errors of lease operations.
var (
	// ErrLeaseLost means the caller no longer holds the lease: it expired and was taken over,
	// or the work was finished by someone else. The caller must stop writing.
	ErrLeaseLost = errors.New("claim: lease lost")
	// ErrHeld means another owner holds a live lease.
	ErrHeld = errors.New("claim: lease held by another owner")
)

// Lease is stored inside the document it guards. The zero Lease is free and has never been claimed.
type Lease struct {
	Owner     string     `firestore:"owner"`
	Epoch     int64      `firestore:"epoch"`
	ExpiresAt *time.Time `firestore:"expires_at,omitempty"`
}

// Live reports whether someone holds the lease at now.
func (l Lease) Live(now time.Time) bool {
	return l.Owner != "" && l.ExpiresAt != nil && now.Before(*l.ExpiresAt)
}

// Expired reports whether the lease was held and its holder let it lapse without releasing it.
func (l Lease) Expired(now time.Time) bool {
	return l.Owner != "" && l.ExpiresAt != nil && !now.Before(*l.ExpiresAt)
}

// HeldBy reports whether owner holds the lease at epoch, live at now.
func (l Lease) HeldBy(owner string, epoch int64, now time.Time) bool {
	return l.Live(now) && l.Owner == owner && l.Epoch == epoch
}

// Take claims the lease for owner until now+ttl and raises the epoch. It refuses a live lease
// held by anyone else.
func (l *Lease) Take(owner string, now time.Time, ttl time.Duration) error {
	if l.Live(now) && l.Owner != owner {
		return ErrHeld
	}
	exp := now.Add(ttl)
	l.Owner, l.ExpiresAt = owner, &exp
	l.Epoch++
	return nil
}

// Renew extends a lease that owner holds at epoch. A lease that lapsed is renewed too while its
// owner and epoch are unchanged: nobody took it over (a takeover raises the epoch) or released it,
// so nobody else can have acted on the work, and a holder whose renewals failed for a while (a
// contended document, a Firestore hiccup) keeps its work instead of having it claimed and paid for
// again. Called inside the document's transaction, the check and the write are one.
func (l *Lease) Renew(owner string, epoch int64, now time.Time, ttl time.Duration) error {
	if owner == "" || l.Owner != owner || l.Epoch != epoch {
		return ErrLeaseLost
	}
	exp := now.Add(ttl)
	l.ExpiresAt = &exp
	return nil
}

// Release frees a lease that owner holds at epoch, keeping the epoch so later claims still rise.
func (l *Lease) Release(owner string, epoch int64) error {
	if l.Owner != owner || l.Epoch != epoch {
		return ErrLeaseLost
	}
	l.Owner, l.ExpiresAt = "", nil
	return nil
}

// Clear frees the lease whoever holds it (used when the work itself ends), keeping the epoch.
func (l *Lease) Clear() {
	l.Owner, l.ExpiresAt = "", nil
}
