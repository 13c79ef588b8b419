package store

import (
	"context"
	"fmt"
	"strconv"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/quota"
)

// TenantRatesCollection holds each tenant's leased model-quota allowance: tenant_rates/{tenant},
// the requests and tokens leased in each slot of the last window (quota.TenantRates).
const TenantRatesCollection = "tenant_rates"

var _ quota.RateStore = (*Store)(nil)

// rateSlot is what one slot holds in a tenant_rates document.
type rateSlot struct {
	Requests int64 `firestore:"requests"`
	Tokens   int64 `firestore:"tokens"`
}

// rateDoc is a tenant_rates document: the slots of the last window, by slot number.
type rateDoc struct {
	Slots map[string]rateSlot `firestore:"slots"`
}

// LeaseRate is quota.RateStore's lease: one transaction of the tenant's document (one read, one
// write) that gives back l.Returns, drops the slots that left every window a lease may ask for
// now and grants by quota.RateLease.Grant, the slots after l.Slot counted with it (leased ahead,
// or by a clock ahead) and kept.
func (s *Store) LeaseRate(ctx context.Context, l quota.RateLease) (quota.RateGrant, error) {
	ref := s.FS.Collection(TenantRatesCollection).Doc(l.Tenant)
	first := l.Slot - int64(l.Span)
	keep := first // older slots count in no window a lease may ask for now
	if l.Current > 0 {
		keep = min(first, l.Current-int64(l.Span))
	}
	var g quota.RateGrant
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		var d rateDoc
		snap, err := tx.Get(ref)
		switch {
		case status.Code(err) == codes.NotFound:
		case err != nil:
			return err
		default:
			if err := snap.DataTo(&d); err != nil {
				return fmt.Errorf("decode tenant rate %s: %w", l.Tenant, err)
			}
		}
		slots := map[int64]quota.RateUse{}
		for k, v := range d.Slots {
			if n, err := strconv.ParseInt(k, 10, 64); err == nil && n >= keep {
				slots[n] = quota.RateUse{Requests: v.Requests, Tokens: v.Tokens}
			}
		}
		for n, u := range l.Returns {
			if n >= keep {
				w := slots[n].Sub(u)
				slots[n] = quota.RateUse{Requests: max(w.Requests, 0), Tokens: max(w.Tokens, 0)}
			}
		}
		window := make([]quota.RateUse, l.Span+1)
		out := rateDoc{Slots: map[string]rateSlot{}}
		var ahead quota.RateUse // leased for a later slot (a lease ahead, or a clock ahead): counted, and kept
		for n, u := range slots {
			switch {
			case n > l.Slot:
				ahead = ahead.Add(u)
			case n >= first:
				window[n-first] = u
			}
		}
		window[l.Span] = window[l.Span].Add(ahead)
		g = l.Grant(window)
		slots[l.Slot] = g.Window[l.Span].Sub(ahead)
		for n, u := range slots {
			if u != (quota.RateUse{}) {
				out.Slots[strconv.FormatInt(n, 10)] = rateSlot{Requests: u.Requests, Tokens: u.Tokens}
			}
		}
		return tx.Set(ref, out)
	}, s.txOptions()...)
	if err != nil {
		return quota.RateGrant{}, fmt.Errorf("lease rate of tenant %s: %w", l.Tenant, err)
	}
	return g, nil
}
