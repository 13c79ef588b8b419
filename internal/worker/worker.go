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
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/batcher"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/protocol"
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
	// worker's nudge: protocol.DeliveryLease of GENBOX_WEBHOOK_TIMEOUT.
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
	beforeRemember func(*protocol.Task)
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
		beforeRemember: func(*protocol.Task) {}}
	for _, o := range opts {
		o(h)
	}
	return h
}

// finished records a task's move into an end state.
func (h *Handler) finished(ctx context.Context, t *protocol.Task) {
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
		// Created waiting by the publisher (store.SlotHints), or marked by whoever found the
		// slots taken, perhaps a second ago: a slot freed since with none found waiting is found
		// by the recheck. The instance that takes its nudge pools it as it reads it, as the one
		// that marks a task does, so that handing it a slot costs no query of the waiting tasks.
		log.DebugContext(ctx, "waiting for a slot of its tenant", "not_before", c.task.NotBefore)
		h.slots.pooled(c.task)
		h.recheck(c.task.Tenant)
		return bus.Ack
	}
	log.DebugContext(ctx, "claimed", "due_lag_ms", c.late.Milliseconds())
	h.runClaimed(work, log, c.task, p)
	return bus.Ack
}

// runClaimed runs t, claimed for this instance, in its place p, under the work context.
func (h *Handler) runClaimed(work context.Context, log *slog.Logger, t *protocol.Task, p *place) {
	h.metrics.WorkerOutcome(work, obs.WorkerClaimed)
	h.metrics.TaskState(work, t.Family, task.StateRunning)
	crashpoint.Hit(crashpoint.AfterClaim)
	h.runOf(log, t, p).execute(work)
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
	task    *protocol.Task
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
	rules := h.pol.rules()
	t, err := h.mutate(ctx, &protocol.Task{ID: id}, func(t *protocol.Task, now time.Time) ([]store.Write, error) {
		outcome, late = claimNot, 0
		if t.DueAt != nil && now.After(*t.DueAt) {
			late = now.Sub(*t.DueAt)
		}
		fresh := false
		switch t.State {
		case task.StateScheduled, task.StateQueued, task.StateWaiting:
			if !protocol.TaskDue(t, now) {
				if t.AwaitsSlot && h.slots != nil {
					outcome = claimAwaiting
				}
				return nil, store.ErrNoChange
			}
			fresh = true
		case task.StateRunning:
			if !protocol.TaskDue(t, now) || t.InBatchJob() {
				return nil, store.ErrNoChange
			}
			if rules.TakeOver(t, now) {
				outcome = claimDead
				return nil, nil
			}
		default:
			return nil, store.ErrNoChange
		}
		if t.Expired(now) {
			rules.Expire(t, now)
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
		if err := rules.Claim(t, now); err != nil {
			return nil, err
		}
		outcome = claimed
		return w, nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound), status.Code(err) == codes.Aborted:
		return claimResult{outcome: claimNot, task: &protocol.Task{ID: id}}, nil
	case err != nil:
		return claimResult{}, err
	}
	if outcome == claimed && t.Slot && t.Claims == 0 && h.slots != nil {
		h.slots.hold(t.Tenant, +1)
		h.metrics.TenantSlot(ctx, t.Tenant, obs.SlotTaken)
	}
	return claimResult{outcome: outcome, task: t, late: late}, nil
}

// rules are the protocol's changes as this instance makes them (protocol.Rules). A task that
// ends is nudged to the resulthandler by this worker right after the commit (nudgeResult), under
// the delivery reservation its commit made (protocol.Rules.Finish).
func (p Policy) rules() protocol.Rules {
	return protocol.Rules{Owner: p.Owner, LeaseTTL: p.LeaseTTL, MaxAttempts: p.MaxAttempts, ClaimCap: p.ClaimCap,
		NudgeGrace: p.NudgeGrace, DeliveryLease: p.DeliveryLease}
}

// execute is steps 2–5 of docs/architecture.md §4 for the run's claimed task in its place: the
// model call holds a call slot, freed as soon as it returns, before the outcome is written.
func (r *run) execute(ctx context.Context) {
	defer r.callOver()
	h, t, log := r.h, r.task, r.log
	rend, req, err := h.request(t)
	if err != nil {
		log.ErrorContext(ctx, "cannot render the task's prompt; failed", "error", err)
		r.fail(ctx, &protocol.TaskError{Kind: task.KindPermanent, Message: err.Error()})
		return
	}
	if t.Mode == task.ModeBatch && !t.BatchOnline && h.batch.Deadline > 0 {
		// A batch job reads the copies its tasks recorded: made here, to last its whole wait.
		var ok bool
		if req, ok = r.prepareFiles(ctx, req, h.batch.Deadline, nil); !ok {
			return
		}
	}
	if r.holdForBatch(ctx, rend, req) {
		return
	}
	fp := h.cacheKey(t, rend, req)
	// The lease is renewed from the claim on — through the policy's reads, the call and the
	// commit of its output — so that a slow step never lets it lapse while this process still
	// works on it: a paid output held while its commit is retried is not generated again elsewhere.
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	last := &lastWrite{t: t.Clone()}
	stopRenewal := h.keepLease(ctx, cancel, log, last, r.epoch)
	defer stopRenewal()
	tk, ok := r.before(ctx, req, fp)
	if !ok {
		return
	}
	req.Admit = tk.admit
	if req, ok = r.prepareFiles(ctx, req, 0, last); !ok {
		return
	}

	req, observe := h.contextCache(ctx, log, t, rend, req)
	req, stopPreviews := h.previews(ctx, log, t, r.epoch, req)
	start := time.Now()
	res, err := h.generate(callCtx, log, t, req)
	stopPreviews()
	cause := context.Cause(callCtx)
	r.res = res
	r.callOver() // at once: no slot waits on what follows
	observe(res)
	if protocol.Spent(res) {
		h.metrics.Generation(ctx, generationModel(res, err), t.Tenant, res.Usage, res.CostUSD, time.Since(start))
	}
	if err != nil {
		stopRenewal() // what follows releases or ends the lease at once
	}

	switch {
	case err == nil:
		crashpoint.Hit(crashpoint.Answered)
		r.persist(ctx, answer{res: res, start: start, fingerprint: fp, known: last.get()})
	case errors.Is(cause, protocol.ErrOutputStored):
		log.InfoContext(ctx, "another worker stored the output first; call cancelled")
		h.metrics.WorkerOutcome(ctx, obs.WorkerLost)
		r.account(ctx)
	case ctx.Err() != nil:
		log.WarnContext(ctx, "shutting down before the model answered; lease released")
		r.release(ctx)
	case errors.Is(err, gemini.ErrUnavailable):
		r.unavailable(ctx, rend, req)
	default:
		switch gemini.ClassOf(err) {
		case gemini.Permanent, gemini.Quality, gemini.Budget:
			r.fail(ctx, taskError(err))
		case gemini.Shed:
			r.shed(ctx)
		default: // transient, network, or unclassified: retried later, counted — unless it opened the last breaker
			if h.exhausted(req) {
				r.unavailable(ctx, rend, req)
				return
			}
			r.retry(ctx, err)
		}
	}
}

// request renders the model request of t.
func (h *Handler) request(t *protocol.Task) (*prompts.Rendered, gemini.Request, error) {
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
	rules := h.pol.rules()
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		crashpoint.Hit(crashpoint.MidGenerate)
		renewed, err := h.store.MutateTaskFrom(ctx, last.get(), func(t *protocol.Task, now time.Time) error {
			return rules.Renew(t, epoch, now)
		})
		wait = h.pol.RenewEvery
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, protocol.ErrOutputStored):
			cancel(protocol.ErrOutputStored)
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
	t  *protocol.Task
}

func (w *lastWrite) get() *protocol.Task {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.t
}

func (w *lastWrite) set(t *protocol.Task) {
	w.mu.Lock()
	w.t = t
	w.mu.Unlock()
}

// renewRetry is the jittered delay before a failed renewal is tried again: well inside any lease.
func renewRetry() time.Duration { return jitter(time.Second) }

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
func (r *run) persist(ctx context.Context, a answer) {
	r.callOver()
	ctx = context.WithoutCancel(ctx) // a paid output persists even during shutdown
	h, log, epoch, replay := r.h, r.log, r.epoch, r.task.Replay
	res := a.res
	var outcome persistOutcome
	out := protocol.Output{Text: res.Text, Model: res.Model, Tier: res.Tier, Degraded: res.Degraded,
		Cached: a.cached, Stale: a.stale, Fingerprint: a.fingerprint}
	fn := func(t *protocol.Task, now time.Time) error {
		if protocol.OutputMine(t, replay, epoch) {
			outcome = persistMineSeen
			return store.ErrNoChange
		}
		r.rules.AddSpend(t, epoch, res)
		if !protocol.TakesOutput(t, replay) {
			outcome = persistAccount
			return nil
		}
		r.rules.CommitOutput(t, epoch, out, now)
		outcome = persistStored
		return nil
	}
	known := a.known
	if known == nil {
		known = &protocol.Task{ID: r.id}
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
// publish only waits for the sweeper, which nudges the delivery once the reservation its commit
// made (protocol.Rules.Finish) has lapsed.
func (h *Handler) nudgeResult(ctx context.Context, log *slog.Logger, t *protocol.Task) {
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
func (h *Handler) mutateRetrying(ctx context.Context, log *slog.Logger, known *protocol.Task, fn store.MutateFunc) (*protocol.Task, error) {
	deadline := time.Now().Add(h.pol.CommitRetry)
	warned := false
	for attempt := 1; ; attempt++ {
		t, err := h.mutate(ctx, known, func(t *protocol.Task, now time.Time) ([]store.Write, error) { return nil, fn(t, now) })
		known = &protocol.Task{ID: known.ID} // after an unknown outcome, decide on what is stored
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

// account records what a cancelled call spent.
func (r *run) account(ctx context.Context) {
	r.callOver()
	if !protocol.Spent(r.res) {
		return
	}
	if _, err := r.h.mutateRetrying(context.WithoutCancel(ctx), r.log, &protocol.Task{ID: r.id}, func(t *protocol.Task, _ time.Time) error {
		if !r.rules.AddSpend(t, r.epoch, r.res) {
			return store.ErrNoChange
		}
		return nil
	}); err != nil {
		r.log.ErrorContext(ctx, "could not record the spend of a cancelled call", "error", err)
	}
}

// release hands the task back (queued) without counting a failed attempt: a clean release.
func (r *run) release(ctx context.Context) {
	if _, ok := r.outcome(ctx, "release", func(t *protocol.Task, _ time.Time) {
		r.rules.Release(t, r.epoch)
	}); ok {
		r.h.metrics.WorkerOutcome(ctx, obs.WorkerReleased)
	}
}

// retry releases the task after a transient failure with a jittered not_before — never sooner
// than the servers' RetryInfo asked — or kills it when its attempts are exhausted. A failure that
// was only rate limits with RetryInfo spends no attempt: the request was turned away for the
// quota, not tried, and a tenant's tokens-per-minute must not burn its attempts into the DLQ.
func (r *run) retry(ctx context.Context, err error) {
	h, log := r.h, r.log
	e := taskError(err)
	var wait time.Duration
	rateLimited := false
	var ge *gemini.Error
	if errors.As(err, &ge) {
		wait, rateLimited = ge.RetryAfter, ge.RateLimited
	}
	dead := false
	delay := func(attempts int) time.Duration { return max(h.pol.retryBackoff().Delay(attempts, nil), wait) }
	t, ok := r.outcome(ctx, "retry", func(t *protocol.Task, now time.Time) {
		dead = r.rules.Retry(t, r.epoch, now, e, !rateLimited, delay)
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
func (r *run) park(ctx context.Context, chain []string) {
	h := r.h
	delay := func(parks int) time.Duration { return h.pol.parkBackoff().Delay(parks, nil) }
	if t, ok := r.outcome(ctx, "park", func(t *protocol.Task, now time.Time) {
		var next *time.Time
		if h.mp.Estimator != nil {
			at := h.mp.Estimator.NextCall(chain)
			next = &at
		}
		r.rules.Park(t, r.epoch, now, delay, next)
	}); ok {
		h.metrics.WorkerOutcome(ctx, obs.WorkerParked)
		r.log.WarnContext(ctx, "every model unavailable; parked", "parks", t.Parks, "not_before", t.NotBefore)
	}
}

// fail ends the task as failed with e.
func (r *run) fail(ctx context.Context, e *protocol.TaskError) {
	if t, ok := r.outcome(ctx, "fail", func(t *protocol.Task, now time.Time) {
		r.rules.Fail(t, e, now)
	}); ok {
		r.h.metrics.WorkerOutcome(ctx, obs.WorkerFailed)
		r.h.finished(ctx, t)
		r.log.WarnContext(ctx, "failed", "error_kind", string(e.Kind), "error", e.Message)
		r.h.nudgeResult(ctx, r.log, t)
	}
}

// publishNotices sends the task's DLQ notices after their commit. A lost publish is re-sent by
// the sweeper: the notice stays on the task until the dlqnotifier clears it.
func (h *Handler) publishNotices(ctx context.Context, log *slog.Logger, t *protocol.Task) {
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
func taskError(err error) *protocol.TaskError {
	var ge *gemini.Error
	if errors.As(err, &ge) {
		kind := task.ErrorKind(ge.Class)
		if ge.Class == gemini.Budget {
			kind = task.KindBudget
		}
		return &protocol.TaskError{Kind: kind, Code: ge.Code, Message: ge.Error()}
	}
	return &protocol.TaskError{Kind: task.KindTransient, Message: err.Error()}
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
