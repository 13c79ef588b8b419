package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
)

// SweeperMember is a sweepers/{owner} document: a worker instance's sweeper, over which the sweep
// shards are spread.
type SweeperMember struct {
	Owner     string    `firestore:"owner"`
	BeatAt    time.Time `firestore:"beat_at"`    // its last write: the instance was alive then
	ExpiresAt time.Time `firestore:"expires_at"` // it is taken as dead from then on
}

// BeatSweeper writes owner's sweepers/{owner} document, alive for ttl from now, and returns the
// live members, owner included, in the order of their names. The expired documents of instances
// that died are deleted on the way, each only if unchanged since read.
func (s *Store) BeatSweeper(ctx context.Context, owner string, ttl time.Duration) ([]SweeperMember, error) {
	coll := s.FS.Collection(SweepersCollection)
	now := s.Now().UTC()
	self := SweeperMember{Owner: owner, BeatAt: now, ExpiresAt: now.Add(ttl)}
	if _, err := coll.Doc(owner).Set(ctx, self); err != nil {
		return nil, fmt.Errorf("write sweeper member %s: %w", owner, err)
	}
	live := []SweeperMember{self}
	it := coll.Documents(ctx)
	defer it.Stop()
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read sweeper members: %w", err)
		}
		var o SweeperMember
		if err := snap.DataTo(&o); err != nil || o.Owner == owner {
			continue
		}
		if !now.Before(o.ExpiresAt) {
			_, _ = snap.Ref.Delete(ctx, firestore.LastUpdateTime(snap.UpdateTime))
			continue
		}
		live = append(live, o)
	}
	slices.SortFunc(live, func(a, b SweeperMember) int { return cmp.Compare(a.Owner, b.Owner) })
	return live, nil
}

// LeaveSweepers deletes owner's sweepers/{owner} document, so the other instances reassign its
// shards at once.
func (s *Store) LeaveSweepers(ctx context.Context, owner string) error {
	_, err := s.FS.Collection(SweepersCollection).Doc(owner).Delete(ctx)
	return err
}
