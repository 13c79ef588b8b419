package sweeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"

	"github.com/genbox-dev/genbox/internal/store"
)

// members is the sweeper instances as this one last read them, so that the shards can be
// assigned evenly: shard k to the k-th live instance modulo their number, in the order of their
// names. Each instance writes its sweepers/{owner} document every Interval, valid for the
// leadership TTL, and deletes it when it stops; the expired documents of instances that died are
// deleted by whoever reads them. It decides only who should lead a shard, never who may: the
// leases do that, so instances that disagree for a while only move a shard once more.
type members struct {
	coll  *firestore.CollectionRef
	owner string
	ttl   time.Duration
	now   func() time.Time

	mu   sync.Mutex
	live []member // sorted by owner, this instance included; nil until read
}

// member is a sweepers/{owner} document.
type member struct {
	Owner     string    `firestore:"owner"`
	BeatAt    time.Time `firestore:"beat_at"`    // its last write: the instance was alive then
	ExpiresAt time.Time `firestore:"expires_at"` // it is taken as dead from then on
}

func newMembers(s *store.Store, owner string, ttl time.Duration) *members {
	return &members{coll: s.FS.Collection(store.SweepersCollection), owner: owner, ttl: ttl, now: s.Now}
}

// run refreshes the membership (Run has read it once before) every interval until ctx ends,
// then deletes this instance's document so the others reassign its shards at once.
func (m *members) run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	defer func() { _, _ = m.coll.Doc(m.owner).Delete(context.WithoutCancel(ctx)) }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m.refreshLogged(ctx, log)
	}
}

func (m *members) refreshLogged(ctx context.Context, log *slog.Logger) {
	if err := m.refresh(ctx); err != nil && ctx.Err() == nil {
		log.WarnContext(ctx, "sweeper members not read; shards kept as they are", "error", err)
	}
}

// refresh writes this instance's document and reads the live ones.
func (m *members) refresh(ctx context.Context) error {
	now := m.now().UTC()
	self := member{Owner: m.owner, BeatAt: now, ExpiresAt: now.Add(m.ttl)}
	if _, err := m.coll.Doc(m.owner).Set(ctx, self); err != nil {
		return fmt.Errorf("write sweeper member %s: %w", m.owner, err)
	}
	live := []member{self}
	it := m.coll.Documents(ctx)
	defer it.Stop()
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return fmt.Errorf("read sweeper members: %w", err)
		}
		var o member
		if err := snap.DataTo(&o); err != nil || o.Owner == m.owner {
			continue
		}
		if !now.Before(o.ExpiresAt) {
			_, _ = snap.Ref.Delete(ctx, firestore.LastUpdateTime(snap.UpdateTime))
			continue
		}
		live = append(live, o)
	}
	slices.SortFunc(live, func(a, b member) int { return cmp.Compare(a.Owner, b.Owner) })
	m.mu.Lock()
	m.live = live
	m.mu.Unlock()
	return nil
}

// assigned names the instance shard k is assigned to and when it was last seen alive; ok is
// false until the membership has been read.
func (m *members) assigned(k int) (owner string, beat time.Time, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.live) == 0 {
		return "", time.Time{}, false
	}
	o := m.live[k%len(m.live)]
	return o.Owner, o.BeatAt, true
}
