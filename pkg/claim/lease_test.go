package claim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/claim"
)

// A lapsed lease is renewed by its holder while nobody took it over or freed it: the holder's
// renewals failed for a while, nobody else can have acted on the work. Anything that moved the
// lease on (a takeover, a release, the work's end) is final.
func TestLeaseRenew(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const ttl = 30 * time.Second
	taken := func() claim.Lease {
		var l claim.Lease
		if err := l.Take("a", t0, ttl); err != nil {
			t.Fatal(err)
		}
		return l
	}
	tests := []struct {
		name    string
		lease   func() claim.Lease
		owner   string
		epoch   int64
		at      time.Time
		wantErr error
	}{
		{"live", taken, "a", 1, t0.Add(10 * time.Second), nil},
		{"lapsed, nobody took it over", taken, "a", 1, t0.Add(2 * ttl), nil},
		{"taken over after it lapsed", func() claim.Lease {
			l := taken()
			if err := l.Take("b", t0.Add(2*ttl), ttl); err != nil {
				t.Fatal(err)
			}
			return l
		}, "a", 1, t0.Add(2 * ttl), claim.ErrLeaseLost},
		{"taken again by the same owner", func() claim.Lease {
			l := taken()
			if err := l.Take("a", t0.Add(2*ttl), ttl); err != nil {
				t.Fatal(err)
			}
			return l
		}, "a", 1, t0.Add(2 * ttl), claim.ErrLeaseLost},
		{"released", func() claim.Lease {
			l := taken()
			if err := l.Release("a", 1); err != nil {
				t.Fatal(err)
			}
			return l
		}, "a", 1, t0.Add(time.Second), claim.ErrLeaseLost},
		{"cleared with the work", func() claim.Lease { l := taken(); l.Clear(); return l }, "a", 1, t0.Add(time.Second), claim.ErrLeaseLost},
		{"another owner", taken, "b", 1, t0.Add(2 * ttl), claim.ErrLeaseLost},
		{"never claimed", func() claim.Lease { return claim.Lease{} }, "", 0, t0, claim.ErrLeaseLost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := tc.lease()
			before := l
			err := l.Renew(tc.owner, tc.epoch, tc.at, ttl)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Renew: %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				if l.Owner != before.Owner || l.Epoch != before.Epoch || (l.ExpiresAt == nil) != (before.ExpiresAt == nil) {
					t.Errorf("a refused renewal changed the lease: %+v, was %+v", l, before)
				}
				return
			}
			if l.Owner != tc.owner || l.Epoch != tc.epoch || !l.HeldBy(tc.owner, tc.epoch, tc.at) || !l.ExpiresAt.Equal(tc.at.Add(ttl)) {
				t.Errorf("renewed lease %+v, want %s at epoch %d until %s", l, tc.owner, tc.epoch, tc.at.Add(ttl))
			}
		})
	}
}
