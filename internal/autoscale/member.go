package autoscale

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"cloud.google.com/go/firestore"
)

// Member is one worker instance of the pool: it says it is alive and how busy its slots are
// (scaling/{pool}/members/{owner}), stops claiming while the pool drains and says when it has
// drained, and follows the pool's instance count (its quota share).
type Member struct {
	cfg   Config
	doc   *firestore.DocumentRef
	self  *firestore.DocumentRef
	owner string
	load  func() Load
	share func(float64)
	log   *slog.Logger

	mu      sync.Mutex
	state   State
	stateAt time.Time     // the document's update time as state was read; zero: it did not exist
	read    bool          // state has been read once
	changed chan struct{} // closed, and replaced, at each change of state
	drained int64         // the epoch of the last drain this instance finished
}

// NewMember returns the member owner of cfg's pool: load reports its slots, share receives its
// share of the Gemini quota (1 / instances) whenever the count changes.
func NewMember(cfg Config, fs *firestore.Client, owner string, load func() Load, share func(float64), log *slog.Logger) *Member {
	doc := stateDoc(fs, cfg)
	return &Member{cfg: cfg, doc: doc, self: doc.Collection("members").Doc(owner), owner: owner, load: load, share: share, log: log,
		changed: make(chan struct{})}
}

// Gate runs pull — the instance's consumption of work — under the pool's drains, until ctx
// ends: pull runs while the pool is not draining; a drain ends its context, and once pull has
// returned (its calls finished, every claimed task either done or released) the member says it
// has drained and waits for the drain to end before pulling again. The member writes its
// document before it first reads the pool's, so a controller that saw no member yet drains an
// instance that has not started pulling either.
func (m *Member) Gate(pull func(ctx context.Context) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() {
			cancel()
			wg.Wait()
			_, _ = m.self.Delete(context.WithoutCancel(ctx))
		}()
		m.beat(ctx)
		wg.Go(func() { m.watch(ctx) })
		wg.Go(func() { m.heartbeat(ctx) })
		for {
			st, changed, ok := m.current()
			switch {
			case !ok || st.Draining:
				if ok && m.drained < st.Epoch {
					m.mu.Lock()
					m.drained = st.Epoch
					m.mu.Unlock()
					m.beat(ctx)
					m.log.InfoContext(ctx, "drained", "epoch", st.Epoch, "target", st.Target)
				}
				select {
				case <-changed:
					continue
				case <-ctx.Done():
					return nil
				}
			}
			if err := m.pullUntilDrain(ctx, pull); err != nil || ctx.Err() != nil {
				return err
			}
		}
	}
}

// pullUntilDrain runs pull until ctx ends or the pool starts draining.
func (m *Member) pullUntilDrain(ctx context.Context, pull func(ctx context.Context) error) error {
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			st, changed, _ := m.current()
			if st.Draining {
				stop()
				return
			}
			select {
			case <-changed:
			case <-pctx.Done():
				return
			}
		}
	}()
	return pull(pctx)
}

// current returns the pool's state as last read, a channel closed at its next change, and
// whether it has been read at all.
func (m *Member) current() (State, <-chan struct{}, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state, m.changed, m.read
}

// watch follows the pool's document until ctx ends.
func (m *Member) watch(ctx context.Context) {
	for ctx.Err() == nil {
		it := m.doc.Snapshots(ctx)
		for {
			snap, err := it.Next()
			if err != nil {
				if ctx.Err() == nil {
					m.log.WarnContext(ctx, "pool document not followed; listening again", "error", err)
				}
				break
			}
			m.apply(ctx, snap)
		}
		it.Stop()
		select {
		case <-ctx.Done():
		case <-time.After(m.cfg.Interval):
		}
	}
}

// apply takes snap as the pool's state unless the state already taken is as recent: a listener
// is not trusted alone (the Firestore emulator has been seen to deliver a new listener's first
// snapshot after a later change, and never that change), so each beat reads the document too.
func (m *Member) apply(ctx context.Context, snap *firestore.DocumentSnapshot) {
	var st State
	if snap.Exists() {
		if err := snap.DataTo(&st); err != nil {
			m.log.ErrorContext(ctx, "pool document undecodable", "error", err)
			return
		}
	}
	m.mu.Lock()
	if m.read && !snap.UpdateTime.After(m.stateAt) {
		m.mu.Unlock()
		return
	}
	m.state, m.stateAt, m.read = st, snap.UpdateTime, true
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
	m.share(st.Share())
}

// heartbeat writes the member's document, and reads the pool's, every Interval until ctx ends.
func (m *Member) heartbeat(ctx context.Context) {
	tick := time.NewTicker(m.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m.beat(ctx)
		if snap, err := m.doc.Get(ctx); snap != nil { // a document not found is a snapshot too
			m.apply(ctx, snap)
		} else if ctx.Err() == nil {
			m.log.WarnContext(ctx, "pool document not read", "error", err)
		}
	}
}

// beat writes the member's document: alive for three Intervals, its last drain, its load.
func (m *Member) beat(ctx context.Context) {
	l := m.load()
	now := time.Now().UTC()
	m.mu.Lock()
	doc := member{Owner: m.owner, BeatAt: now, ExpiresAt: now.Add(3 * m.cfg.Interval), Drained: m.drained,
		Slots: l.Slots, Calling: l.Calling, Served: l.Served, BusyMS: l.Busy.Milliseconds()}
	m.mu.Unlock()
	if _, err := m.self.Set(ctx, doc); err != nil && ctx.Err() == nil {
		m.log.WarnContext(ctx, "pool member not written", "error", err)
	}
}
