// Package sweeper guarantees progress (docs/architecture.md §0): one leader per sweep shard finds
// every task document of its shard whose due_at has passed and nudges what is due on it — the task itself, its webhook
// delivery, its DLQ notices, a decision's unpublished nudges, a Slack update — then records a
// capped nudge backoff in a write guarded by the document's update time, so a backlog is never
// re-published on every pass and a concurrent change is never erased.
package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"golang.org/x/time/rate"
	"google.golang.org/api/iterator"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/internal/leader"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/backoff"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Publisher publishes a nudge (bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

var _ Publisher = (*bus.Publisher)(nil)

// Local takes a due task's nudge in this instance, as a gemini-tasks message would be taken
// (the worker's Local). Offer reports whether it was taken: false when there is no room.
type Local interface {
	Offer(taskID string) bool
}

// WithLocal hands the due tasks a pass finds to l first, and publishes only those it has no room
// for. A published nudge is only as good as its consumer: one handed to a process that dies
// waits out its ack deadline, and the Pub/Sub emulator keeps routing new messages to the streams
// of a killed subscriber, so after a crash the nudges of a live leader could all be lost while
// each doubled the task's nudge backoff. A task taken here is claimed by the leader's own
// instance within the pass that found it due.
func WithLocal(l Local) Option { return func(s *Sweeper) { s.local = l } }

// Config is the sweeper's configuration.
type Config struct {
	Interval    time.Duration // GENBOX_SWEEP_INTERVAL: time between passes
	Limit       int           // GENBOX_SWEEP_LIMIT: documents per pass
	Pace        float64       // GENBOX_SWEEP_PACE: documents nudged per second at most
	ReleaseRate float64       // GENBOX_SWEEP_RELEASE_RATE: parked tasks released per second when a chain closes
	LeaderTTL   time.Duration // GENBOX_SWEEP_LEADER_TTL: the leadership lease
	BackoffBase time.Duration // GENBOX_SWEEP_BACKOFF_BASE: the first re-nudge delay
	BackoffMax  time.Duration // GENBOX_SWEEP_BACKOFF_MAX: the cap of the re-nudge delay
	Shards      int           // GENBOX_SWEEP_SHARDS: sweep shards, each with its own leader (0 is one)
}

// ErrConfig means a sweeper setting is invalid; the message names the variable.
var ErrConfig = errors.New("sweeper: invalid configuration")

// FromEnv reads the configuration with defaults, calling getenv for every variable it knows.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Interval: 5 * time.Second, Limit: 500, Pace: 200, ReleaseRate: 20,
		BackoffBase: 30 * time.Second, BackoffMax: 15 * time.Minute,
	}
	r := envconfig.New(getenv)
	r.Duration("GENBOX_SWEEP_INTERVAL", &c.Interval)
	r.Duration("GENBOX_SWEEP_LEADER_TTL", &c.LeaderTTL)
	r.Duration("GENBOX_SWEEP_BACKOFF_BASE", &c.BackoffBase)
	r.Duration("GENBOX_SWEEP_BACKOFF_MAX", &c.BackoffMax)
	r.Float("GENBOX_SWEEP_PACE", &c.Pace)
	r.Float("GENBOX_SWEEP_RELEASE_RATE", &c.ReleaseRate)
	r.Int("GENBOX_SWEEP_LIMIT", &c.Limit)
	if err := r.Err(); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	shards, err := store.ShardsFromEnv(getenv)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c.Shards = shards
	if c.LeaderTTL == 0 {
		c.LeaderTTL = 3 * c.Interval
	}
	return c, c.Validate()
}

// Validate reports every setting that cannot work, naming its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, name, why)) }
	if c.Interval <= 0 {
		bad("GENBOX_SWEEP_INTERVAL", "must be positive")
	}
	if c.Limit < 1 {
		bad("GENBOX_SWEEP_LIMIT", "must be at least 1")
	}
	if c.Pace <= 0 || c.ReleaseRate <= 0 {
		bad("GENBOX_SWEEP_PACE/GENBOX_SWEEP_RELEASE_RATE", "must be positive")
	}
	if c.LeaderTTL <= c.Interval {
		bad("GENBOX_SWEEP_LEADER_TTL", "must be longer than GENBOX_SWEEP_INTERVAL")
	}
	if c.BackoffBase <= 0 || c.BackoffMax < c.BackoffBase {
		bad("GENBOX_SWEEP_BACKOFF_BASE/GENBOX_SWEEP_BACKOFF_MAX", "must be positive with base <= max")
	}
	return errors.Join(errs...)
}

// LeaderDoc is the leaders/{id} document whose lease makes one sweeper the leader of shard 0;
// shard k > 0 has leaders/sweeper-{k} (LeaderDocOf).
const LeaderDoc = "sweeper"

// LeaderDocOf is the leaders/{id} document of shard k's leadership. Shard 0 keeps the name the
// unsharded sweeper used, so an old and a new instance never both lead it during a rollout.
func LeaderDocOf(k int) string {
	if k == 0 {
		return LeaderDoc
	}
	return fmt.Sprintf("%s-%d", LeaderDoc, k)
}

// Sweeper nudges due work. Run it in every instance: each shard is swept by its leader only.
type Sweeper struct {
	store        *store.Store
	pub          Publisher
	defaultChain []string
	log          *slog.Logger
	cfg          Config
	shards       []*shard
	members      *members // nil with one shard: there is nothing to spread

	release  *rate.Limiter
	gauges   *gauges  // nil without WithMetrics
	local    Local    // nil without WithLocal
	breakers Breakers // the store's documents, read per chain and pass, without WithBreakers

	mu         sync.Mutex
	unrecorded map[string]unrecorded // by task id: nudges whose backoff write failed
	unreadable map[string]time.Time  // by chain: the first failed read of its breakers since the last good one
	held       map[string][]string   // by chain: the models of a chain whose parked tasks this leader holds
}

// unrecorded is the backoff of a nudge that was published but whose guarded write failed for a
// reason other than a concurrent change — typically contention: the write waited for the
// document's lock and ended in Aborted. It holds for the document version it was computed from;
// any later write is progress and ends it, as it resets a recorded backoff.
type unrecorded struct {
	pass       int // the shard whose pass recorded it, or strayPass
	updateTime time.Time
	nudges     int
	nudgeAt    time.Time
}

// New returns a Sweeper whose leadership leases are held as owner. defaultChain is the model
// chain of a task that names none (GENBOX_MODEL_CHAIN): its parked tasks wait on that chain.
func New(s *store.Store, pub Publisher, defaultChain []string, log *slog.Logger, cfg Config, owner string, opts ...Option) *Sweeper {
	cfg.Shards = max(cfg.Shards, 1)
	sw := &Sweeper{
		store: s, pub: pub, defaultChain: defaultChain, log: log, cfg: cfg,
		release: rate.NewLimiter(rate.Limit(cfg.ReleaseRate), 1),

		unrecorded: map[string]unrecorded{},
		unreadable: map[string]time.Time{},
		held:       map[string][]string{},
	}
	for k := range cfg.Shards {
		sw.shards = append(sw.shards, &shard{
			n:     k,
			lease: s.Leader(LeaderDocOf(k), owner, cfg.LeaderTTL),
			pace:  rate.NewLimiter(rate.Limit(cfg.Pace), max(1, int(cfg.Pace))),
		})
	}
	if cfg.Shards > 1 {
		sw.members = newMembers(s, owner, cfg.LeaderTTL)
	}
	sw.breakers = s
	for _, o := range opts {
		o(sw)
	}
	return sw
}

// Run sweeps every Interval each shard this instance leads, until ctx ends; it then gives the
// leaderships up so other instances need not wait for the leases to expire. Every shard is
// offered to every instance: one takes a shard that is free and assigned to it (members), or
// whose leader let its lease expire, and hands a shard it leads over to the instance it is
// assigned to; so the shards spread over the instances and a dead one's are taken over as soon
// as their leases expire. The leader of shard 0 also sweeps the strays (strays), releases parked
// tasks and reports the backlog gauges.
func (s *Sweeper) Run(ctx context.Context) error {
	defer s.registerGauges(ctx)()
	var wg sync.WaitGroup
	if s.members != nil {
		s.members.refreshLogged(ctx, s.log)
		wg.Go(func() { s.members.run(ctx, s.cfg.Interval, s.log) })
	}
	for _, sh := range s.shards {
		wg.Go(func() { s.runShard(ctx, sh) })
	}
	wg.Wait()
	return nil
}

// shard is one sweep shard as this instance sees it; its fields other than n, lease and pace
// belong to the shard's Run goroutine.
type shard struct {
	n     int
	lease *claim.Doc
	pace  *rate.Limiter // GENBOX_SWEEP_PACE holds per shard, so re-drive throughput grows with shards

	epoch int64     // the lease's epoch while this instance leads, else 0
	since time.Time // when this instance took the lease at epoch
}

// runShard leads and sweeps shard sh while it can, until ctx ends. The leader of shard 0 also
// wakes when the breakers change and when a chain whose parked tasks it holds may take a probe,
// and releases what they allow (releaseParked) before its pass.
func (s *Sweeper) runShard(ctx context.Context, sh *shard) {
	first := sh.n == 0
	full := true // every parked task is to be looked at: this instance has just taken the lead
	loop := &leader.Loop{Name: "sweeper", Elector: shardLead{s, sh}, Interval: s.cfg.Interval,
		Log: s.log.With("shard", sh.n), Now: s.store.Now,
		Left: func() {
			sh.epoch = 0
			s.forgetAll(sh.n)
		}}
	if first {
		loop.Wake = s.changed
	}
	loop.Run(ctx, func(ctx context.Context, epoch int64) time.Time {
		if epoch != sh.epoch {
			full, sh.since = true, s.store.Now()
		}
		sh.epoch = epoch
		var next time.Time // when a held chain may take a probe
		if first {
			var rerr error
			if next, rerr = s.releaseParked(ctx, full); rerr != nil && ctx.Err() == nil {
				s.log.WarnContext(ctx, "parked tasks not released; retried next pass", "error", rerr)
			}
			full = full && rerr != nil
		}
		if _, err := s.passShard(ctx, sh); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "sweep pass failed", "shard", sh.n, "error", err)
		}
		if first {
			s.observe(ctx)
		}
		return next
	})
}

// shardLead is the leadership of one shard as the loop elects it: lead, and the shard's lease.
type shardLead struct {
	s  *Sweeper
	sh *shard
}

var _ leader.Elector = shardLead{}

func (l shardLead) Acquire(ctx context.Context) (claim.Lease, error) { return l.s.lead(ctx, l.sh) }

func (l shardLead) Release(ctx context.Context, epoch int64) error {
	return l.sh.lease.Release(ctx, epoch)
}

// lead takes or renews this instance's leadership of sh, or fails with claim.ErrHeld when it is
// not to lead it. A shard assigned to this instance is taken when free. One assigned to another
// instance is taken only from a leader that let its lease expire (it died: its shards must not
// wait for the membership to notice), and a shard this instance leads is handed back once the
// instance it is assigned to has shown itself alive since this one took it.
func (s *Sweeper) lead(ctx context.Context, sh *shard) (claim.Lease, error) {
	if s.members == nil {
		return sh.lease.Acquire(ctx)
	}
	owner, beat, ok := s.members.assigned(sh.n)
	if !ok || owner == sh.lease.Owner {
		return sh.lease.Acquire(ctx)
	}
	if sh.epoch > 0 {
		if !beat.After(sh.since) {
			return sh.lease.Acquire(ctx)
		}
		if err := sh.lease.Release(ctx, sh.epoch); err != nil {
			return claim.Lease{}, err
		}
		s.log.InfoContext(ctx, "sweep shard handed over", "shard", sh.n, "to", owner)
		return claim.Lease{}, claim.ErrHeld
	}
	l, err := sh.lease.Get(ctx)
	if err != nil {
		return claim.Lease{}, err
	}
	if !l.Expired(s.store.Now()) {
		return claim.Lease{}, claim.ErrHeld
	}
	return sh.lease.Acquire(ctx)
}

// strayPass tags the unrecorded backoffs of the strays' pass.
const strayPass = -1

// Pass runs one sweep of every shard and of the strays, as their leaders would: the due
// documents, oldest due first, at most Limit per shard, paced. It returns how many documents it
// nudged.
func (s *Sweeper) Pass(ctx context.Context) (int, error) {
	total := 0
	for _, sh := range s.shards {
		n, err := s.passShard(ctx, sh)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// passShard sweeps the due documents of shard sh, and for shard 0 the strays as well: documents
// without a due_shard (written before there were shards) or with one out of range (written with
// more shards than there are now). With one shard, its query is the strays' — every due document.
func (s *Sweeper) passShard(ctx context.Context, sh *shard) (int, error) {
	now := s.store.Now().UTC()
	n := 0
	if s.cfg.Shards > 1 {
		q := s.store.DueTasks(sh.n, now)
		var err error
		if n, err = s.pass(ctx, sh, sh.n, q, now); err != nil || sh.n != 0 {
			return n, err
		}
	}
	q := s.store.DueTasks(-1, now)
	m, err := s.pass(ctx, sh, strayPass, q, now)
	return n + m, err
}

// pass sweeps what q returns (tagged pass in the unrecorded backoffs), at most Limit documents,
// paced by sh. The strays' pass skips the documents of a shard, which their leaders sweep.
func (s *Sweeper) pass(ctx context.Context, sh *shard, pass int, q firestore.Query, now time.Time) (int, error) {
	it := q.Limit(s.cfg.Limit).Documents(ctx)
	defer it.Stop()
	n, docs := 0, 0
	seen := map[string]bool{}
	r := newRound(pass)
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			s.forgetUnseen(pass, seen, docs < s.cfg.Limit, now)
			return n, r.unpublished
		}
		if err != nil {
			return n, fmt.Errorf("sweep query: %w", err)
		}
		docs++
		if pass == strayPass && s.cfg.Shards > 1 && store.InShard(snap, s.cfg.Shards) {
			continue
		}
		seen[snap.Ref.ID] = true
		t, err := store.DecodeTask(snap)
		if err != nil {
			s.log.ErrorContext(ctx, "undecodable task skipped", "task_id", snap.Ref.ID, "error", err)
			continue
		}
		if s.backingOff(t, now) {
			continue
		}
		if err := sh.pace.Wait(ctx); err != nil {
			return n, nil
		}
		if s.sweep(ctx, t, r, false) {
			n++
		}
	}
}

// round is what one pass, or one release of parked tasks, keeps across its documents: what it
// learnt of each chain's breakers, and the first publish that failed. Pub/Sub is then taken as
// unreachable for the rest of the round: nothing more is published (each try would wait out the
// publish timeout), a document with nothing else to do is left due for the next round, and due
// tasks still go to the leader's own instance.
type round struct {
	pass        int // the shard swept, or strayPass: it tags the backoffs left unrecorded
	chains      chainViews
	unpublished error
}

func newRound(pass int) *round { return &round{pass: pass, chains: chainViews{}} }

// sweep nudges what is due on t and records the nudge, and reports whether it nudged anything.
// A released task (releaseParked) is nudged whatever its own backoff says, and that backoff is
// cleared.
func (s *Sweeper) sweep(ctx context.Context, t *protocol.Task, r *round, released bool) bool {
	log := s.log.With("task_id", t.ID)
	now := s.store.Now().UTC()
	nudged, skipped := false, false
	publish := func(topic string, attrs map[string]string) bool {
		if r.unpublished != nil {
			skipped = true
			return false
		}
		if err := s.publish(ctx, topic, attrs); err != nil {
			log.WarnContext(ctx, "nudge not published; nothing more is published this pass", "topic", topic, "error", err)
			r.unpublished = err
			skipped = true
			return false
		}
		nudged = true
		return true
	}
	idAttr := map[string]string{task.AttrTaskID: t.ID}
	var late time.Duration // how long the document had been due: what liveness bounds
	if t.DueAt != nil && now.After(*t.DueAt) {
		late = now.Sub(*t.DueAt)
	}
	var hold time.Time // a parked task left alone until then, without growing the backoff
	nudge := released  // the task itself is nudged, once its backoff is recorded
	if !released && protocol.TaskDue(t, now) {
		if hold = s.parked(ctx, t, r.chains, now); hold.IsZero() {
			nudge = true
		}
	}
	if t.Delivery.Claimable(now, 0) {
		publish(bus.TopicResults, idAttr)
	}
	for _, n := range t.Notices {
		if !n.Due(now) {
			continue
		}
		topic := bus.TopicTasksDLQ
		if n.Stage == task.StageDelivery {
			topic = bus.TopicResultsDLQ
		}
		publish(topic, n.Attributes(t.ID))
	}
	decided := false // every nudge of a decision is published: the decision is carried out
	if d := t.Decision; d.Due(now) {
		decided = true
		for _, topic := range d.Topics {
			decided = publish(topic, idAttr) && decided
		}
	}
	if t.SlackUpdate.Due(now) {
		publish(bus.TopicTasksDLQ, map[string]string{task.AttrTaskID: t.ID, task.AttrKind: task.AttrKindSlackUpdate})
	}
	if t.FileErase.Due(now) {
		publish(bus.TopicTasks, map[string]string{task.AttrTaskID: t.ID, task.AttrKind: store.KindFileErase})
	}
	if nudged {
		hold = time.Time{}
	}
	if skipped && !nudged && !nudge && hold.IsZero() {
		return false // nothing went out: left due for the next pass
	}
	s.backoff(ctx, log, t, r.pass, now, hold, decided, released)
	// The task's nudge comes after its backoff is written: a claim taken here at once would
	// otherwise race that write for the document, and a released task's backoff must be gone
	// before its claim.
	if nudge {
		via := "local"
		if s.local != nil && s.local.Offer(t.ID) {
			nudged = true
		} else if via = "pubsub"; !publish(bus.TopicTasks, idAttr) {
			via = ""
		}
		if via != "" {
			log.DebugContext(ctx, "task nudged", "via", via, "due_lag_ms", late.Milliseconds())
		}
	}
	return nudged
}

// publish publishes one nudge within the sweeper's publish timeout.
func (s *Sweeper) publish(ctx context.Context, topic string, attrs map[string]string) error {
	pctx, cancel := context.WithTimeout(ctx, s.publishTimeout())
	defer cancel()
	if _, err := s.pub.Publish(pctx, topic, nil, attrs); err != nil {
		return fmt.Errorf("publish nudge to %s: %w", topic, err)
	}
	return nil
}

// unreadableSince records a failed read of a chain's breakers at now and returns the first
// failure since the chain was last read.
func (s *Sweeper) unreadableSince(key string, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	since, failing := s.unreadable[key]
	if !failing {
		since = now
		s.unreadable[key] = since
	}
	return since
}

// publishTimeout bounds one nudge: a publish waits for Pub/Sub's answer, and while Pub/Sub is
// unreachable the client would otherwise hold a pass for its own 60 s timeout.
func (s *Sweeper) publishTimeout() time.Duration { return min(s.cfg.Interval, 5*time.Second) }

// backoff records the nudge (hold: a parked task left alone until then, without growing the
// backoff; decided: a decision's nudges are all published, so its topics are cleared; released:
// a parked task nudged before its own backoff ended, which is cleared): nudges+1, nudge_at = now +
// capped exponential backoff, and the due_at that follows, in store.RecordNudge's write guarded
// by the update time read — a document someone changed meanwhile is left as they wrote it (their
// write reset the backoff and recomputed due_at). A write that fails otherwise leaves the backoff
// in this process (backingOff), so the next pass does not publish the same nudges again.
func (s *Sweeper) backoff(ctx context.Context, log *slog.Logger, t *protocol.Task, pass int, now time.Time, hold time.Time, decided, released bool) {
	next := hold
	delay := hold.Sub(now)
	if hold.IsZero() {
		t.Nudges++
		delay = backoff.Policy{Base: s.cfg.BackoffBase, Max: s.cfg.BackoffMax}.Ceiling(t.Nudges)
		next = now.Add(delay)
	}
	t.NudgeAt = &next
	err := s.store.RecordNudge(ctx, t, now, s.cfg.Shards, decided, released)
	switch {
	case err == nil:
		s.forget(t.ID)
	case errors.Is(err, store.ErrChanged):
		s.forget(t.ID)
		log.DebugContext(ctx, "task changed during the sweep; its writer rescheduled it")
	default:
		// Most likely contention: the write waited for the document's lock and lost. Re-publishing
		// on every pass would feed that contention a fresh claim each time, so the backoff holds in
		// this process, counted from now (the wait may have outlasted it), until the document
		// changes.
		at := s.store.Now().UTC().Add(delay)
		s.remember(t.ID, unrecorded{pass: pass, updateTime: t.UpdateTime, nudges: t.Nudges, nudgeAt: at})
		log.WarnContext(ctx, "nudge backoff not recorded; kept in memory", "nudges", t.Nudges, "nudge_at", at, "error", err)
	}
}

// backingOff reports whether t was nudged by this process within a backoff its write could not
// record. Past that backoff it gives t the unrecorded nudge count, so the next delay grows as a
// recorded one would. A document changed since is progress: the entry is dropped.
func (s *Sweeper) backingOff(t *protocol.Task, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.unrecorded[t.ID]
	switch {
	case !ok:
		return false
	case !u.updateTime.Equal(t.UpdateTime):
		delete(s.unrecorded, t.ID)
		return false
	case now.Before(u.nudgeAt):
		return true
	}
	t.Nudges = u.nudges
	return false
}

func (s *Sweeper) remember(id string, u unrecorded) {
	s.mu.Lock()
	s.unrecorded[id] = u
	s.mu.Unlock()
}

func (s *Sweeper) forget(id string) {
	s.mu.Lock()
	delete(s.unrecorded, id)
	s.mu.Unlock()
}

// forgetUnseen drops the entries of pass whose backoff had ended by now but whose document the
// pass did not return: after a complete pass, it is no longer due (changed, finished or deleted); after one
// cut at Limit, it may still be due behind the others, so only entries ended BackoffMax ago go,
// which bounds the map under a lasting backlog. Forgetting one only loses the unrecorded count.
func (s *Sweeper) forgetUnseen(pass int, seen map[string]bool, complete bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, u := range s.unrecorded {
		if u.pass == pass && !seen[id] && (complete && !now.Before(u.nudgeAt) || now.Sub(u.nudgeAt) >= s.cfg.BackoffMax) {
			delete(s.unrecorded, id)
		}
	}
}

// forgetAll drops the unrecorded backoffs of shard k's passes (for shard 0, the strays' too), when
// another instance leads it: the leader that takes over has its own.
func (s *Sweeper) forgetAll(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, u := range s.unrecorded {
		if u.pass == k || k == 0 && u.pass == strayPass {
			delete(s.unrecorded, id)
		}
	}
}
