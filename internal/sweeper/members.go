package sweeper

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/store"
)

// members is the sweeper instances as this one last read them, so that the shards can be
// assigned evenly: shard k to the k-th live instance modulo their number, in the order of their
// names. Each instance writes its sweepers/{owner} document every Interval, valid for the
// leadership TTL, and deletes it when it stops; the expired documents of instances that died are
// deleted by whoever reads them. It decides only who should lead a shard, never who may: the
// leases do that, so instances that disagree for a while only move a shard once more.
type members struct {
	store *store.Store
	owner string
	ttl   time.Duration

	mu   sync.Mutex
	live []store.SweeperMember // sorted by owner, this instance included; nil until read
}

func newMembers(s *store.Store, owner string, ttl time.Duration) *members {
	return &members{store: s, owner: owner, ttl: ttl}
}

// run refreshes the membership (Run has read it once before) every interval until ctx ends,
// then deletes this instance's document so the others reassign its shards at once.
func (m *members) run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	defer func() { _ = m.store.LeaveSweepers(context.WithoutCancel(ctx), m.owner) }()
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
	live, err := m.store.BeatSweeper(ctx, m.owner, m.ttl)
	if err != nil {
		return err
	}
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
