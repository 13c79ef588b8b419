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
// write) that gives back l.Returns, drops the slots that left the window and grants by
// quota.RateLease.Grant.
func (s *Store) LeaseRate(ctx context.Context, l quota.RateLease) (quota.RateGrant, error) {
	ref := s.FS.Collection(TenantRatesCollection).Doc(l.Tenant)
	first := l.Slot - int64(l.Span)
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
		window := make([]quota.RateUse, l.Span+1)
		out := rateDoc{Slots: map[string]rateSlot{}}
		var ahead quota.RateUse // leased by an instance whose clock is ahead: counted, and kept
		for k, v := range d.Slots {
			n, err := strconv.ParseInt(k, 10, 64)
			u := quota.RateUse{Requests: v.Requests, Tokens: v.Tokens}
			switch {
			case err != nil || n < first: // left the window: counts no more
			case n > l.Slot:
				ahead = ahead.Add(u)
				out.Slots[k] = v
			default:
				window[n-first] = u
			}
		}
		for n, u := range l.Returns {
			if n >= first && n <= l.Slot {
				w := window[n-first].Sub(u)
				window[n-first] = quota.RateUse{Requests: max(w.Requests, 0), Tokens: max(w.Tokens, 0)}
			}
		}
		window[l.Span] = window[l.Span].Add(ahead)
		g = l.Grant(window)
		g.Window[l.Span] = g.Window[l.Span].Sub(ahead)
		for i, u := range g.Window {
			if u != (quota.RateUse{}) {
				out.Slots[strconv.FormatInt(first+int64(i), 10)] = rateSlot{Requests: u.Requests, Tokens: u.Tokens}
			}
		}
		return tx.Set(ref, out)
	}, s.txOptions()...)
	if err != nil {
		return quota.RateGrant{}, fmt.Errorf("lease rate of tenant %s: %w", l.Tenant, err)
	}
	return g, nil
}
