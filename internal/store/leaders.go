package store

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/claim"
)

// Leader is the lease of leaders/{id}, held as owner for ttl on the store's clock: the
// leadership of a background service (internal/leader).
func (s *Store) Leader(id, owner string, ttl time.Duration) *claim.Doc {
	return &claim.Doc{FS: s.FS, Ref: s.FS.Collection(LeadersCollection).Doc(id), Owner: owner, TTL: ttl, Now: s.Now}
}

// TakeTurn claims the next turn of leaders/{id}, a duty run once every every by whichever
// instance comes first (the fallback drill): it reports true when the turn was due — its next_at
// has passed or was never set — and moving next_at every ahead was not beaten by another
// instance, false when the turn is not due or another instance took it.
func (s *Store) TakeTurn(ctx context.Context, id string, every time.Duration) (bool, error) {
	ref := s.FS.Collection(LeadersCollection).Doc(id)
	now := s.Now().UTC()
	next := map[string]any{"next_at": now.Add(every)}
	snap, err := ref.Get(ctx)
	switch {
	case status.Code(err) == codes.NotFound:
		_, err = ref.Create(ctx, next)
	case err != nil:
		return false, fmt.Errorf("read %s: %w", id, err)
	default:
		var doc struct {
			NextAt time.Time `firestore:"next_at"`
		}
		if err := snap.DataTo(&doc); err != nil {
			return false, fmt.Errorf("decode %s: %w", id, err)
		}
		if now.Before(doc.NextAt) {
			return false, nil
		}
		_, err = ref.Update(ctx, []firestore.Update{{Path: "next_at", Value: next["next_at"]}}, firestore.LastUpdateTime(snap.UpdateTime))
	}
	switch status.Code(err) {
	case codes.OK:
		return true, nil
	case codes.AlreadyExists, codes.FailedPrecondition:
		return false, nil // another instance took this turn
	}
	return false, fmt.Errorf("claim %s: %w", id, err)
}
