// Package worker is the heart of genbox (docs/architecture.md §4): per gemini-tasks nudge it claims the task in
// Firestore under a fenced lease, calls the model while renewing the lease, persists the output
// immediately (first output wins, never overwritten, a finished task never revived), nudges
// gemini-results and only then acks. Every other outcome is written to the task (retry backoff,
// park, failure, dead with a DLQ notice) and the message is acked: retries are scheduled in
// Firestore, never by nacking, and the sweeper carries whatever a crash leaves behind.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/batcher"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/backoff"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Generator makes one task's model call under the call policy (gemini.Client).
type Generator interface {
	Generate(ctx context.Context, req gemini.Request) (gemini.Result, error)
}

// Renderer renders a task's prompt from its family and variant (prompts.Registry).
type Renderer interface {
	Render(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error)
}

// Publisher publishes a nudge (bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

var (
	_ Generator = (*gemini.Client)(nil)
	_ Renderer  = (*prompts.Registry)(nil)
	_ Publisher = (*bus.Publisher)(nil)
)

// Policy is what the handler needs of the configuration.
type Policy struct {
	Owner       string        // lease owner: this instance
	LeaseTTL    time.Duration // a claim's lease
	RenewEvery  time.Duration // renewal interval while the model runs
	MaxAttempts int           // failed generations before dead
	ClaimCap    int           // takeovers of an expired lease before dead
	RetryBase   time.Duration // transient retry backoff: full jitter over base·2^(attempts-1), capped
	RetryMax    time.Duration
	ParkBase    time.Duration // park backoff: uniform in the upper half of base·2^(parks-1), capped
	ParkMax     time.Duration
	NudgeGrace  time.Duration // the sweeper holds off a dead task's DLQ notice this long after the worker's own nudge
	CommitRetry time.Duration // how long a failed commit (of an output, of spend) is retried
	FlexMargin  time.Duration // a flex task closer than this to run_before is called on the standard tier
	// PreviewEvery throttles a streamed task's previews: one write this often at most (0: 500 ms).
	PreviewEvery time.Duration
	// DeliveryLease is how long the commit that ends a task reserves its delivery for the
	// worker's nudge: store.DeliveryLease of GENBOX_WEBHOOK_TIMEOUT.
	DeliveryLease time.Duration
}

// Handler handles gemini-tasks messages. It is safe for concurrent use.
type Handler struct {
	store  *store.Store
	gen    Generator
	render Renderer
	pub    Publisher
	log    *slog.Logger
	pol    Policy
	mp     ModelPolicy
	batch  batcher.Config // zero: batch-mode tasks run online
	files  Files          // zero: tasks with files fail

	abort   context.Context // cancelled by Abort: in-flight calls give up and release their lease
	cancel  context.CancelFunc
	metrics *obs.Metrics // nil records nothing

	// inHand holds the ids of the tasks this instance is claiming or running: a duplicate nudge
	// for one of them is acked without a write (see Handle).
	inHand bus.InHand
	// slots is this instance's side of its tenants' concurrency slots; nil: tenants' caps are
	// not applied (WithTenantSlots).
	slots *slots
	// shares divides the pool between contending tenants by weight; nil: each keeps its own
	// cap (WithFairShares).
	shares *shares
	// local runs the tasks a slot was handed to in this instance; nil: none is (NewLocal).
	local *Local
	// room bounds the tasks in hand, claimed and calling the model, whether their nudge came
	// through Pub/Sub or from this instance's sweeper (Local); nil: no bound (WithCapacity).
	room *capacity

	// beforeRemember runs between an output's commit and the writes of its cache entry and last
	// good output: the window a test erases the task in.
	beforeRemember func(*store.Task)
}

// Option configures a Handler.
type Option func(*Handler)

// WithTenantSlots applies each tenant's concurrency cap across instances (slots.go); a task over
// it waits, and is looked at again after waitMax at the latest (GENBOX_TENANT_WAIT_MAX).
func WithTenantSlots(waitMax time.Duration) Option {
	return func(h *Handler) { h.slots = newSlots(waitMax) }
}

// WithMetrics records task states, generations and retries in m.
func WithMetrics(m *obs.Metrics) Option { return func(h *Handler) { h.metrics = m } }

var _ bus.Handler = (*Handler)(nil)

// New returns a Handler.
func New(s *store.Store, gen Generator, render Renderer, pub Publisher, log *slog.Logger, pol Policy, opts ...Option) *Handler {
	abort, cancel := context.WithCancel(context.Background())
	h := &Handler{store: s, gen: gen, render: render, pub: pub, log: log, pol: pol, abort: abort, cancel: cancel,
		beforeRemember: func(*store.Task) {}}
	for _, o := range opts {
		o(h)
	}
	return h
}

// finished records a task's move into an end state.
func (h *Handler) finished(ctx context.Context, t *store.Task) {
	var e2e time.Duration
	if t.CompletedAt != nil {
		e2e = t.CompletedAt.Sub(t.CreatedAt)
	}
	h.metrics.TaskFinished(ctx, t.Family, t.State, e2e)
	h.deleteCopies(ctx, h.log, t)
}

// Abort makes every in-flight model call give up and release its lease (fenced): the end of
// the shutdown grace period. Calls that answered still persist their output.
func (h *Handler) Abort() { h.cancel() }

// Handle claims the task named by the message, runs it and acks. It never nacks: whatever it
// cannot act on is left to the lease owner or the sweeper.
func (h *Handler) Handle(ctx context.Context, m *bus.Message) bus.Result {
	id := m.Attributes[task.AttrTaskID]
	if id == "" {
		h.log.WarnContext(ctx, "message without a task id; acked", "message_id", m.ID)
		return bus.Ack
	}
	log := h.log.With("task_id", id, "delivery_attempt", m.DeliveryAttempt)
	if m.Attributes[task.AttrKind] == store.KindFileErase {
		h.eraseCopies(ctx, log, id)
		return bus.Ack
	}
	if !h.takeInHand(ctx, log, id) {
		return bus.Ack
	}
	defer h.inHand.Delete(id)
	h.warm(ctx, m.Attributes[task.AttrTenant])
	p, ok := h.room.enter(ctx, true)
	if !ok { // pulling stopped before there was room: the task is still due
		return bus.Ack
	}
	defer p.leave()
	return h.handle(ctx, log, id, m.Attributes[task.AttrTenant], p)
}

// takeInHand records that this instance has task id in hand, or reports that it already had
// (bus.InHand): a nudge for it is then acked, where its claim could take over a lease lapsed
// mid-call and pay for a second call in the same process.
func (h *Handler) takeInHand(ctx context.Context, log *slog.Logger, id string) bool {
	if !h.inHand.Take(id) {
		log.DebugContext(ctx, "task already in hand in this instance; acked")
		h.metrics.WorkerOutcome(ctx, obs.WorkerNotClaimed)
		return false
	}
	return true
}

// handle is Handle for a task this instance has in hand, in its place p of the capacity.
func (h *Handler) handle(ctx context.Context, log *slog.Logger, id, tenant string, p *place) bus.Result {
	// The work outlives the pull's context (it ends when pulling stops) and ends only by Abort.
	work, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	defer context.AfterFunc(h.abort, stop)()

	crashpoint.Hit(crashpoint.BeforeClaim)
	var c claimResult
	var err error
	if !p.claim(func() { c, err = h.tracedClaim(work, id, tenant) }) { // pulling stopped first: the task is still due
		return bus.Ack
	}
	if err != nil {
		log.WarnContext(ctx, "claim failed; acked, the sweeper will nudge again", "error", err)
		h.metrics.WorkerOutcome(ctx, obs.WorkerNotClaimed)
		return bus.Ack
	}
	if c.outcome != claimed {
		p.endCall() // no call to make: the place among the claimed goes to the next task
	}
	switch c.outcome {
	case claimNot:
		log.DebugContext(ctx, "not claimable; acked", "state", string(c.task.State))
		h.metrics.WorkerOutcome(ctx, obs.WorkerNotClaimed)
		return bus.Ack
	case claimExpired:
		log.InfoContext(ctx, "run_before passed; failed as expired")
		h.metrics.WorkerOutcome(ctx, obs.WorkerFailed)
		h.finished(ctx, c.task)
		h.nudgeResult(work, log, c.task)
		return bus.Ack
	case claimDead:
		log.ErrorContext(ctx, "task killed its worker past the claim cap; dead", "claims", c.task.Claims)
		h.metrics.WorkerOutcome(ctx, obs.WorkerDead)
		h.finished(ctx, c.task)
		h.nudgeResult(work, log, c.task)
		h.publishNotices(work, log, c.task)
		return bus.Ack
	case claimWaiting:
		log.DebugContext(ctx, "tenant at its concurrency cap; waiting for a slot", "not_before", c.task.NotBefore)
		h.metrics.TenantSlot(ctx, c.task.Tenant, obs.SlotWaiting)
		h.slots.pooled(c.task)
		h.recheck(c.task.Tenant)
		return bus.Ack
	case claimAwaiting:
		// Marked waiting by whoever found the slots taken, perhaps a second ago: a slot freed
		// since with none found waiting is found by the recheck. It is not pooled here: a task
		// the worker marked was pooled by the instance that marked it (this is a second nudge,
		// the sweeper's), and two pools handing out the same task make their commits contend; a
		// task created waiting comes after the waiting ones (store.SlotHints) and is found in its
		// turn by the pool's next merge.
		log.DebugContext(ctx, "waiting for a slot of its tenant", "not_before", c.task.NotBefore)
		h.recheck(c.task.Tenant)
		return bus.Ack
	}
	log.DebugContext(ctx, "claimed", "due_lag_ms", c.late.Milliseconds())
	h.runClaimed(work, log, c.task, p)
	return bus.Ack
}

// runClaimed runs t, claimed for this instance, in its place p, under the work context.
func (h *Handler) runClaimed(work context.Context, log *slog.Logger, t *store.Task, p *place) {
	h.metrics.WorkerOutcome(work, obs.WorkerClaimed)
	h.metrics.TaskState(work, t.Family, task.StateRunning)
	crashpoint.Hit(crashpoint.AfterClaim)
	h.run(work, log, t, p)
}

type claimOutcome int

const (
	claimNot claimOutcome = iota
	claimed
	claimExpired
	claimDead
	claimWaiting  // over its tenant's cap: marked waiting for a slot
	claimAwaiting // already waiting for a slot (marked at its submission, or nudged again)
)

type claimResult struct {
	outcome claimOutcome
	task    *store.Task
	// late is how long the task had been due (its due_at passed) when it was claimed: what
	// liveness bounds, whoever crashed or whatever held a nudge.
	late time.Duration
}

// claim runs step 1 of docs/architecture.md §4 in one read-modify-write of the task
// (store.MutateTaskWith): a fresh claim of a capped tenant's task takes one of its slots in the
// same commit, or marks the task waiting for one (slots.go). tenant, when the nudge names it,
// makes the claims that may write the tenant's slot count take turns. Contention
// (codes.Aborted) is "not claimed".
func (h *Handler) claim(ctx context.Context, id, tenant string) (claimResult, error) {
	if tenant != "" && h.admitsTenant(ctx, tenant) {
		ts := h.slots.of(tenant)
		ts.admit.Lock()
		defer ts.admit.Unlock()
	}
	var outcome claimOutcome
	var late time.Duration
	t, err := h.mutate(ctx, &store.Task{ID: id}, func(t *store.Task, now time.Time) ([]store.Write, error) {
		outcome, late = claimNot, 0
		if t.DueAt != nil && now.After(*t.DueAt) {
			late = now.Sub(*t.DueAt)
		}
		fresh := false
		switch t.State {
		case task.StateScheduled, task.StateQueued, task.StateWaiting:
			if !store.TaskDue(t, now) {
				if t.AwaitsSlot && h.slots != nil {
					outcome = claimAwaiting
				}
				return nil, store.ErrNoChange
			}
			fresh = true
		case task.StateRunning:
			if !store.TaskDue(t, now) || t.InBatchJob() {
				return nil, store.ErrNoChange
			}
			t.Claims++
			if t.Claims > h.pol.ClaimCap {
				t.Error = &store.TaskError{Kind: task.KindCrash, Message: fmt.Sprintf("the task's lease expired %d times without a release: it kills its worker", t.Claims-1)}
				h.kill(t, now)
				outcome = claimDead
				return nil, nil
			}
		default:
			return nil, store.ErrNoChange
		}
		if t.Expired(now) {
			t.AwaitsSlot = false
			t.Error = &store.TaskError{Kind: task.KindExpired, Message: "run_before passed before the model was called"}
			h.finish(t, task.StateFailed, now)
			outcome = claimExpired
			return nil, nil
		}
		var w []store.Write
		if fresh {
			var wait bool
			var err error
			if w, wait, err = h.admit(ctx, t); err != nil {
				return nil, err
			}
			if wait {
				h.awaitSlot(t, now)
				outcome = claimWaiting
				return nil, nil
			}
		}
		t.State, t.AwaitsSlot = task.StateRunning, false
		if err := t.Lease.Take(h.pol.Owner, now, h.pol.LeaseTTL); err != nil {
			return nil, err
		}
		outcome = claimed
		return w, nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound), status.Code(err) == codes.Aborted:
		return claimResult{outcome: claimNot, task: &store.Task{ID: id}}, nil
	case err != nil:
		return claimResult{}, err
	}
	if outcome == claimed && t.Slot && t.Claims == 0 && h.slots != nil {
		h.slots.hold(t.Tenant, +1)
		h.metrics.TenantSlot(ctx, t.Tenant, obs.SlotTaken)
	}
	return claimResult{outcome: outcome, task: t, late: late}, nil
}

// kill moves t to dead (stage generation) with a DLQ notice kept as an outbox on the task; the
// caller publishes the notice after the commit and the sweeper re-sends it until it is cleared.
func (h *Handler) kill(t *store.Task, now time.Time) {
	next := now.Add(h.pol.NudgeGrace)
	t.Notices = append(t.Notices, store.Notice{Stage: task.StageGeneration, Replay: t.Replay, Round: 0, NextAttemptAt: &next})
	h.finish(t, task.StateDead, now)
}

// finish ends t in state. Its webhook, if it has one, is nudged by this worker right after the
// commit (nudgeResult), and the commit reserves the delivery for that nudge, so that the
// resulthandler receiving it claims nothing (docs/architecture.md §6). The reservation is a
// delivery lease like a claim's: the sweeper leaves the delivery to the nudge while it lasts, and
// a nudge lost with the process carrying it holds the delivery no longer (docs/liveness.md).
func (h *Handler) finish(t *store.Task, state task.State, now time.Time) {
	t.Finish(state, now)
	t.ReserveDelivery(now, h.pol.DeliveryLease)
}

// errOutputStored cancels a model call whose task already has its output.
var errOutputStored = errors.New("worker: the task already has its output")

// run is steps 2–5 of docs/architecture.md §4 for a claimed task in its place p: the model call
// holds a call slot, freed as soon as it returns, before the outcome is written.
func (h *Handler) run(ctx context.Context, log *slog.Logger, t *store.Task, p *place) {
	defer p.endCall()
	epoch := t.Lease.Epoch
	log = log.With("epoch", epoch)
	r, req, err := h.request(t)
	if err != nil {
		log.ErrorContext(ctx, "cannot render the task's prompt; failed", "error", err)
		h.fail(ctx, log, t.ID, epoch, gemini.Result{}, &store.TaskError{Kind: task.KindPermanent, Message: err.Error()})
		return
	}
	if t.Mode == task.ModeBatch && !t.BatchOnline && h.batch.Deadline > 0 {
		// A batch job reads the copies its tasks recorded: made here, to last its whole wait.
		var ok bool
		if req, ok = h.prepareFiles(ctx, log, t, req, h.batch.Deadline, nil); !ok {
			return
		}
	}
	if h.holdForBatch(ctx, log, t, r, req) {
		return
	}
	fp := h.cacheKey(t, r, req)
	// The lease is renewed from the claim on — through the policy's reads, the call and the
	// commit of its output — so that a slow step never lets it lapse while this process still
	// works on it: a paid output held while its commit is retried is not generated again elsewhere.
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	last := &lastWrite{t: t.Clone()}
	stopRenewal := h.keepLease(ctx, cancel, log, last, epoch)
	defer stopRenewal()
	tk, ok := h.before(ctx, log, t, req, fp, p)
	if !ok {
		return
	}
	req.Admit = tk.admit
	if req, ok = h.prepareFiles(ctx, log, t, req, 0, last); !ok {
		tk.done(gemini.Result{})
		return
	}

	req, observe := h.contextCache(ctx, log, t, r, req)
	req, stopPreviews := h.previews(ctx, log, t, epoch, req)
	start := time.Now()
	res, err := h.generate(callCtx, log, t, req)
	stopPreviews()
	cause := context.Cause(callCtx)
	tk.done(res)
	observe(res)
	if spent(res) {
		h.metrics.Generation(ctx, generationModel(res, err), t.Tenant, res.Usage, res.CostUSD, time.Since(start))
	}
	if err != nil {
		stopRenewal() // what follows releases or ends the lease at once
	}

	switch {
	case err == nil:
		crashpoint.Hit(crashpoint.Answered)
		h.persist(ctx, log, t, epoch, answer{res: res, start: start, fingerprint: fp, known: last.get()})
	case errors.Is(cause, errOutputStored):
		log.InfoContext(ctx, "another worker stored the output first; call cancelled")
		h.metrics.WorkerOutcome(ctx, obs.WorkerLost)
		h.account(ctx, log, t.ID, epoch, res)
	case ctx.Err() != nil:
		log.WarnContext(ctx, "shutting down before the model answered; lease released")
		h.release(ctx, log, t.ID, epoch, res)
	case errors.Is(err, gemini.ErrUnavailable):
		h.unavailable(ctx, log, t, r, req, res)
	default:
		switch gemini.ClassOf(err) {
		case gemini.Permanent, gemini.Quality, gemini.Budget:
			h.fail(ctx, log, t.ID, epoch, res, taskError(err))
		case gemini.Shed:
			h.shed(ctx, log, t.ID, epoch, res)
		default: // transient, network, or unclassified: retried later, counted — unless it opened the last breaker
			if h.exhausted(req) {
				h.unavailable(ctx, log, t, r, req, res)
				return
			}
			h.retry(ctx, log, t.ID, epoch, res, err)
		}
	}
}

// request renders the model request of t.
func (h *Handler) request(t *store.Task) (*prompts.Rendered, gemini.Request, error) {
	r, err := h.render.Render(t.Family, t.Variant, t.Input, t.GenConfig)
	if err != nil {
		return nil, gemini.Request{}, fmt.Errorf("render %s/%s: %w", t.Family, t.Variant, err)
	}
	return r, t.Request(r), nil
}

// keepLease runs renew until the returned stop is called (stop waits for it and may be called
// again). Renewal outlives ctx: an answered output is committed even during shutdown, under its
// lease.
func (h *Handler) keepLease(ctx context.Context, cancel context.CancelCauseFunc, log *slog.Logger, last *lastWrite, epoch int64) (stop func()) {
	renewCtx, end := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.renew(renewCtx, cancel, log, last, epoch)
	}()
	return func() { end(); <-done }
}

// renew extends the lease every RenewEvery (fenced: my epoch, still running, no output) — a
// lease that lapsed too, as long as nobody took it over — and retries a failed renewal within a
// second rather than at the next tick, so that two failures in a row do not let it lapse. When it
// finds the output already stored it cancels the call. A lost lease does not stop the call: a
// zombie's paid output is still kept if it comes first.
func (h *Handler) renew(ctx context.Context, cancel context.CancelCauseFunc, log *slog.Logger, last *lastWrite, epoch int64) {
	wait := h.pol.RenewEvery
	lost, failing := false, false
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		crashpoint.Hit(crashpoint.MidGenerate)
		renewed, err := h.store.MutateTaskFrom(ctx, last.get(), func(t *store.Task, now time.Time) error {
			if t.HasOutput() {
				return errOutputStored
			}
			if !h.fenced(t, epoch) {
				return claim.ErrLeaseLost
			}
			return t.Lease.Renew(h.pol.Owner, epoch, now, h.pol.LeaseTTL)
		})
		wait = h.pol.RenewEvery
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errOutputStored):
			cancel(errOutputStored)
			return
		case errors.Is(err, claim.ErrLeaseLost):
			if !lost {
				lost = true
				log.WarnContext(ctx, "lease no longer mine (taken over, or the task moved on); the call goes on, its output still counts if it is first")
			}
		case err != nil:
			wait = min(h.pol.RenewEvery, renewRetry())
			if !failing {
				failing = true
				log.WarnContext(ctx, "lease renewal failed; retried shortly", "error", err)
			}
		default:
			failing = false
			last.set(renewed)
		}
	}
}

// lastWrite holds the task as the claim or the latest renewal wrote it: the renewals and the
// output commit start from it rather than read the task again (store.MutateTaskFrom). Safe for
// concurrent use; nobody changes the task it holds.
type lastWrite struct {
	mu sync.Mutex
	t  *store.Task
}

func (w *lastWrite) get() *store.Task {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.t
}

func (w *lastWrite) set(t *store.Task) {
	w.mu.Lock()
	w.t = t
	w.mu.Unlock()
}

// renewRetry is the jittered delay before a failed renewal is tried again: well inside any lease.
func renewRetry() time.Duration { return jitter(time.Second) }

// fenced reports whether a non-output write by the holder of epoch may apply to t.
func (h *Handler) fenced(t *store.Task, epoch int64) bool {
	return t.State == task.StateRunning && t.Lease.Owner == h.pol.Owner && t.Lease.Epoch == epoch && !t.HasOutput()
}

// addSpend adds what the call made under epoch paid to t, once: paid tokens are recorded whatever
// happens to the task, and a commit retried after an unknown outcome never counts them twice.
// The usage and cost go to the replay the call belonged to: a zombie of a replay a Regenerate
// ended charges that replay's previous[] entry, not the new one. It reports whether it added
// anything.
func (h *Handler) addSpend(t *store.Task, epoch int64, res gemini.Result) bool {
	key := h.pol.Owner + ":" + strconv.FormatInt(epoch, 10)
	if !spent(res) || slices.Contains(t.SpentBy, key) {
		return false
	}
	t.SpentBy = append(t.SpentBy, key)
	usage, cost, replay := &t.Usage, &t.CostUSD, t.Replay
	if g := t.EarlierReplay(epoch); g != nil {
		usage, cost, replay = &g.Usage, &g.CostUSD, g.Replay
	}
	t.LogAttempts(attemptRecords(replay, epoch, res.Attempts)...)
	*usage = usage.Add(res.Usage)
	*cost += res.CostUSD
	t.InDoubt = t.InDoubt.Add(res.InDoubt)
	t.ModelCalls += res.Calls
	return true
}

// spent reports whether res paid for anything worth recording.
func spent(res gemini.Result) bool {
	return res.Calls > 0 || res.CostUSD > 0 || res.Usage != (task.Usage{}) || res.InDoubt != (task.Usage{})
}

type persistOutcome int

const (
	persistStored   persistOutcome = iota // my output is the task's output
	persistAccount                        // another output won, or the task ended: spend recorded only
	persistMineSeen                       // a retry found my own earlier commit
)

// persist is step 4: the output is committed at once, first output wins. An unknown commit
// outcome is retried in-process while the output is held; finding my epoch's output is success.
// Then the cache entry and last good output (best-effort), and step 5: the gemini-results nudge.
// A cached or stale answer goes the same way, without spend.
func (h *Handler) persist(ctx context.Context, log *slog.Logger, claimed *store.Task, epoch int64, a answer) {
	ctx = context.WithoutCancel(ctx) // a paid output persists even during shutdown
	res := a.res
	var outcome persistOutcome
	fn := func(t *store.Task, now time.Time) error {
		if t.HasOutput() && t.Replay == claimed.Replay && t.OutputEpoch == epoch {
			outcome = persistMineSeen
			return store.ErrNoChange
		}
		h.addSpend(t, epoch, res)
		if t.Replay != claimed.Replay || t.HasOutput() || t.State != task.StateRunning && t.State != task.StateQueued && t.State != task.StateWaiting {
			outcome = persistAccount
			return nil
		}
		t.Output, t.OutputEpoch, t.OutputAt = res.Text, epoch, &now
		t.Model, t.Tier, t.Degraded, t.Error = res.Model, string(res.Tier), res.Degraded, nil
		t.CacheHit, t.Stale = a.cached, a.stale
		if a.fingerprint != "" {
			t.Fingerprint = a.fingerprint
		}
		h.finish(t, task.StateSucceeded, now)
		outcome = persistStored
		return nil
	}
	known := a.known
	if known == nil {
		known = &store.Task{ID: claimed.ID}
	}
	t, err := h.mutateRetrying(ctx, log, known, fn)
	if err != nil {
		// The output is lost with this process; the lease expires and the sweeper re-runs the task.
		log.ErrorContext(ctx, "could not persist the output", "error", err)
		return
	}
	switch outcome {
	case persistAccount:
		h.metrics.WorkerOutcome(ctx, obs.WorkerLost)
		log.WarnContext(ctx, "output refused: the task already has an output or has ended; spend recorded", "state", string(t.State))
		return
	case persistStored, persistMineSeen:
	}
	h.metrics.WorkerOutcome(ctx, obs.WorkerStored)
	if !a.start.IsZero() {
		window := time.Since(a.start)
		h.metrics.PaidWindow(ctx, window)
		log.InfoContext(ctx, "output stored", "model", t.Model, "paid_window_ms", window.Milliseconds(), "output_tokens", t.Usage.OutputTokens)
	}
	if outcome == persistStored {
		h.finished(ctx, t)
	}
	h.remember(ctx, log, t, a)
	crashpoint.Hit(crashpoint.AfterCommit)
	h.nudgeResult(ctx, log, t)
	crashpoint.Hit(crashpoint.AfterPublish)
}

// nudgeResult tells the resulthandler that the task, just ended, has a webhook to deliver. A lost
// publish only waits for the sweeper, which nudges the delivery once finish's grace has passed.
func (h *Handler) nudgeResult(ctx context.Context, log *slog.Logger, t *store.Task) {
	if t.Delivery.State != task.DeliveryPending {
		return
	}
	attrs := map[string]string{task.AttrTaskID: t.ID}
	if epoch := t.ReservedDelivery(time.Now()); epoch > 0 {
		attrs[task.AttrDeliveryEpoch] = strconv.FormatInt(epoch, 10)
	}
	if _, err := h.pub.Publish(ctx, bus.TopicResults, nil, attrs); err != nil {
		log.WarnContext(ctx, "result nudge not published; the sweeper will", "error", err)
	}
}

// mutateRetrying runs mutate, retrying for up to CommitRetry while it fails in a way that
// may pass: a paid output (or spend) held in memory is worth far more than the wait. The
// renewal keeps the lease meanwhile.
func (h *Handler) mutateRetrying(ctx context.Context, log *slog.Logger, known *store.Task, fn store.MutateFunc) (*store.Task, error) {
	deadline := time.Now().Add(h.pol.CommitRetry)
	warned := false
	for attempt := 1; ; attempt++ {
		t, err := h.mutate(ctx, known, func(t *store.Task, now time.Time) ([]store.Write, error) { return nil, fn(t, now) })
		known = &store.Task{ID: known.ID} // after an unknown outcome, decide on what is stored
		if !retryable(err) {
			return t, err
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		if !warned {
			warned = true
			log.WarnContext(ctx, "commit failed or its outcome is unknown; retrying with the output held", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(commitBackoff.Delay(attempt, nil)):
		}
	}
}

// commitBackoff spaces the tries of a commit that may pass: soon at first, the store's worst
// hiccups later.
var commitBackoff = backoff.Policy{Base: 50 * time.Millisecond, Max: 5 * time.Second, Jitter: backoff.Equal}

// retryable reports whether a failed commit may succeed if tried again: it may or may not have
// happened (Unavailable, DeadlineExceeded, Unknown), lost a contention (Aborted), or met a
// passing condition of the service (ResourceExhausted, Internal). What the commit itself decided
// (a missing task, an error of the transaction function) is final.
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// fencedWrite applies change to the task if I still hold it at epoch; the spend of res is
// recorded either way. A refused write is logged; the message is acked all the same.
func (h *Handler) fencedWrite(ctx context.Context, log *slog.Logger, id string, epoch int64, res gemini.Result, what string, change func(t *store.Task, now time.Time)) (*store.Task, bool) {
	ctx = context.WithoutCancel(ctx)
	applied := false
	t, err := h.mutateRetrying(ctx, log, &store.Task{ID: id}, func(t *store.Task, now time.Time) error {
		applied = h.fenced(t, epoch)
		if added := h.addSpend(t, epoch, res); !applied && !added {
			return store.ErrNoChange
		}
		if applied {
			change(t, now)
		}
		return nil
	})
	if err != nil {
		log.ErrorContext(ctx, what+": write failed; the lease will expire and the sweeper re-nudges", "error", err)
		return nil, false
	}
	if !applied {
		h.metrics.WorkerOutcome(ctx, obs.WorkerRefused)
		log.WarnContext(ctx, what+": refused, the lease is no longer mine", "state", string(t.State), "lease_epoch", t.Lease.Epoch)
	}
	return t, applied
}

// account records what a cancelled call spent.
func (h *Handler) account(ctx context.Context, log *slog.Logger, id string, epoch int64, res gemini.Result) {
	if !spent(res) {
		return
	}
	if _, err := h.mutateRetrying(context.WithoutCancel(ctx), log, &store.Task{ID: id}, func(t *store.Task, _ time.Time) error {
		if !h.addSpend(t, epoch, res) {
			return store.ErrNoChange
		}
		return nil
	}); err != nil {
		log.ErrorContext(ctx, "could not record the spend of a cancelled call", "error", err)
	}
}

// release hands the task back (queued) without counting a failed attempt: a clean release.
func (h *Handler) release(ctx context.Context, log *slog.Logger, id string, epoch int64, res gemini.Result) {
	if _, ok := h.fencedWrite(ctx, log, id, epoch, res, "release", func(t *store.Task, _ time.Time) {
		t.State = task.StateQueued
		t.Claims = 0
		_ = t.Lease.Release(h.pol.Owner, epoch) // fenced above: I hold it
	}); ok {
		h.metrics.WorkerOutcome(ctx, obs.WorkerReleased)
	}
}

// retry releases the task after a transient failure with a jittered not_before — never sooner
// than the servers' RetryInfo asked — or kills it when its attempts are exhausted. A failure that
// was only rate limits with RetryInfo spends no attempt: the request was turned away for the
// quota, not tried, and a tenant's tokens-per-minute must not burn its attempts into the DLQ.
func (h *Handler) retry(ctx context.Context, log *slog.Logger, id string, epoch int64, res gemini.Result, err error) {
	e := taskError(err)
	var wait time.Duration
	rateLimited := false
	var ge *gemini.Error
	if errors.As(err, &ge) {
		wait, rateLimited = ge.RetryAfter, ge.RateLimited
	}
	dead := false
	t, ok := h.fencedWrite(ctx, log, id, epoch, res, "retry", func(t *store.Task, now time.Time) {
		if !rateLimited {
			t.Attempts++
		}
		t.Error = e
		dead = !rateLimited && t.Attempts >= h.pol.MaxAttempts
		if dead {
			h.kill(t, now)
			return
		}
		nb := now.Add(max(h.pol.retryBackoff().Delay(t.Attempts, nil), wait))
		t.State, t.NotBefore, t.Claims = task.StateQueued, &nb, 0
		if e.Kind != task.KindNetwork {
			t.Parks = 0 // a model answered: the chain takes calls again
		}
		_ = t.Lease.Release(h.pol.Owner, epoch)
	})
	switch {
	case !ok:
	case dead:
		h.metrics.WorkerOutcome(ctx, obs.WorkerDead)
		h.finished(ctx, t)
		log.ErrorContext(ctx, "attempts exhausted; dead", "attempts", t.Attempts, "error_kind", string(e.Kind), "error", e.Message)
		h.nudgeResult(ctx, log, t)
		h.publishNotices(ctx, log, t)
	default:
		h.metrics.WorkerOutcome(ctx, obs.WorkerReleased)
		h.metrics.Retry(ctx, string(e.Kind))
		log.WarnContext(ctx, "transient failure; retry scheduled", "attempt", t.Attempts, "not_before", t.NotBefore,
			"retry_after_ms", wait.Milliseconds(), "rate_limited", rateLimited, "error", e.Message)
	}
}

// park moves the task to waiting when every model of its chain is unavailable: its own backoff,
// no attempt counted, but no later than the chain may take a call again (a probe), so that the
// sweeper sees the task then whatever its backoff has grown to. chain is what the call ran on.
func (h *Handler) park(ctx context.Context, log *slog.Logger, id string, epoch int64, chain []string, res gemini.Result) {
	if t, ok := h.fencedWrite(ctx, log, id, epoch, res, "park", func(t *store.Task, now time.Time) {
		t.Parks++
		nb := now.Add(h.pol.parkBackoff().Delay(t.Parks, nil))
		if h.mp.Estimator != nil {
			if at := h.mp.Estimator.NextCall(chain); at.Before(nb) {
				nb = maxTime(at, now)
			}
		}
		t.State, t.NotBefore, t.Claims = task.StateWaiting, &nb, 0
		_ = t.Lease.Release(h.pol.Owner, epoch)
	}); ok {
		h.metrics.WorkerOutcome(ctx, obs.WorkerParked)
		log.WarnContext(ctx, "every model unavailable; parked", "parks", t.Parks, "not_before", t.NotBefore)
	}
}

// fail ends the task as failed.
func (h *Handler) fail(ctx context.Context, log *slog.Logger, id string, epoch int64, res gemini.Result, e *store.TaskError) {
	if t, ok := h.fencedWrite(ctx, log, id, epoch, res, "fail", func(t *store.Task, now time.Time) {
		t.Error = e
		h.finish(t, task.StateFailed, now)
	}); ok {
		h.metrics.WorkerOutcome(ctx, obs.WorkerFailed)
		h.finished(ctx, t)
		log.WarnContext(ctx, "failed", "error_kind", string(e.Kind), "error", e.Message)
		h.nudgeResult(ctx, log, t)
	}
}

// publishNotices sends the task's DLQ notices after their commit. A lost publish is re-sent by
// the sweeper: the notice stays on the task until the dlqnotifier clears it.
func (h *Handler) publishNotices(ctx context.Context, log *slog.Logger, t *store.Task) {
	for _, n := range t.Notices {
		topic := bus.TopicTasksDLQ
		if n.Stage == task.StageDelivery {
			topic = bus.TopicResultsDLQ
		}
		if _, err := h.pub.Publish(ctx, topic, nil, n.Attributes(t.ID)); err != nil {
			log.WarnContext(ctx, "DLQ notice not published; the sweeper will", "error", err)
		}
	}
}

// taskError records a classified model error on the task.
func taskError(err error) *store.TaskError {
	var ge *gemini.Error
	if errors.As(err, &ge) {
		kind := task.ErrorKind(ge.Class)
		if ge.Class == gemini.Budget {
			kind = task.KindBudget
		}
		return &store.TaskError{Kind: kind, Code: ge.Code, Message: ge.Error()}
	}
	return &store.TaskError{Kind: task.KindTransient, Message: err.Error()}
}

// retryBackoff is the not_before of a transient retry or a shed: full jitter, so the retries of
// one outage spread over the whole ceiling.
func (p Policy) retryBackoff() backoff.Policy {
	return backoff.Policy{Base: p.RetryBase, Max: p.RetryMax, Jitter: backoff.Full}
}

// parkBackoff is the not_before of a parked task: equal jitter, uniform over the upper half of the
// ceiling, so parked tasks never wake together and none waits past ParkMax.
func (p Policy) parkBackoff() backoff.Policy {
	return backoff.Policy{Base: p.ParkBase, Max: p.ParkMax, Jitter: backoff.Equal}
}

// jitter is a draw from the upper half of d, so that waits begun together do not end together.
func jitter(d time.Duration) time.Duration {
	return backoff.Policy{Base: d, Max: d, Jitter: backoff.Equal}.Delay(1, nil)
}
