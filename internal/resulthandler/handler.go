// Package resulthandler delivers genbox's webhooks (docs/architecture.md §6). It consumes gemini-results
// nudges; for each, it claims the task's pending delivery in Firestore under a lease that
// outlasts three HTTP timeouts (so two instances never POST the same event at once) — or, for the
// worker's nudge, delivers under the lease the worker's commit reserved for it — POSTs the
// payload frozen when the event was queued, signed per Standard Webhooks with every active
// secret of the tenant, through the SSRF-guarded client of internal/ssrf, and records the
// outcome on the task: delivered (then the next queued event starts), a retry at now +
// exponential backoff with full jitter that the sweeper nudges when due, or — for a 4xx other
// than 408/429, a redirect, a refused destination, or a failure past the horizon counted from the
// first attempt — a dead delivery with a DLQ notice to gemini-results-dlq. The task's own state
// never changes here; every attempt is logged on it.
//
// Guarantee: every event is delivered at least once, always with the same webhook-id
// ({task_id}.{type}.{replay}, the same across retries and Redeliver) so receivers can dedupe. A
// duplicate happens only if the process dies between the receiver's 2xx and the commit that
// records the delivery; the lease then expires and the delivery is retried.
package resulthandler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/backoff"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// Store is the task access the handler needs; *store.Store implements it.
type Store interface {
	GetTask(ctx context.Context, id string) (*protocol.Task, error)
	MutateTask(ctx context.Context, id string, fn store.MutateFunc) (*protocol.Task, error)
	MutateTaskFrom(ctx context.Context, known *protocol.Task, fn store.MutateFunc) (*protocol.Task, error)
	Clock() time.Time // the clock of the leases it writes
}

// Secrets gives a tenant's active webhook secrets, newest first; *store.Store implements it.
type Secrets interface {
	WebhookSecrets(ctx context.Context, tenant string) ([]string, error)
}

// SecretsCache keeps each tenant's active webhook secrets for a refresh period, so a delivery
// neither reads the tenant document nor opens its sealed secrets every time.
type SecretsCache struct {
	cache *store.Cache[[]string]
}

// NewSecretsCache returns a SecretsCache over sec that re-reads a tenant at most every refresh.
func NewSecretsCache(sec Secrets, refresh time.Duration) *SecretsCache {
	return &SecretsCache{cache: store.NewCache(refresh, sec.WebhookSecrets)}
}

// WebhookSecrets returns tenant's active secrets as last read, newest first.
func (c *SecretsCache) WebhookSecrets(ctx context.Context, tenant string) ([]string, error) {
	return c.cache.Get(ctx, tenant)
}

// Publisher publishes DLQ notices; *bus.Publisher implements it.
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

// Doer sends a delivery; the *http.Client of ssrf.NewClient is the one to use.
type Doer interface {
	Do(r *http.Request) (*http.Response, error)
}

var (
	_ Store       = (*store.Store)(nil)
	_ Secrets     = (*store.Store)(nil)
	_ Secrets     = (*SecretsCache)(nil)
	_ Publisher   = (*bus.Publisher)(nil)
	_ Doer        = (*http.Client)(nil)
	_ bus.Handler = (*Handler)(nil)
)

// maxChain bounds how many queued events one message delivers back to back; a longer queue is
// left to the sweeper (each started event is due at once).
const maxChain = 8

// commitBudget bounds recording an outcome, which must happen even while shutting down.
const commitBudget = 10 * time.Second

// Handler delivers webhooks; it is a bus.Handler for gemini-results. Safe for concurrent use.
type Handler struct {
	store   Store
	secrets Secrets
	pub     Publisher
	client  Doer
	log     *slog.Logger
	policy  Policy
	metrics *obs.Metrics // nil records nothing

	// Now stamps webhook-timestamp (leases and schedules use the store's clock). Rand draws the
	// backoff's jitter from [0, 1] (nil: math/rand/v2; 1 gives the ceiling). Tests replace them.
	Now  func() time.Time
	Rand func() float64

	// inHand holds the ids of the tasks whose delivery this instance is carrying: a duplicate
	// nudge for one of them is acked without a transaction (see Handle).
	inHand bus.InHand
}

// New returns a Handler.
func New(st Store, sec Secrets, pub Publisher, client Doer, log *slog.Logger, p Policy, opts ...Option) (*Handler, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	h := &Handler{
		store: st, secrets: sec, pub: pub, client: client, log: log, policy: p,
		Now: time.Now,
	}
	for _, o := range opts {
		o(h)
	}
	return h, nil
}

// Handle delivers the pending webhook of the task the message names, if it is due and nobody
// else holds it. It always acks: retries are scheduled on the task, and the sweeper nudges them.
func (h *Handler) Handle(ctx context.Context, m *bus.Message) bus.Result {
	id := m.Attributes[task.AttrTaskID]
	if id == "" {
		h.log.WarnContext(ctx, "resulthandler: message without task id", "message_id", m.ID)
		return bus.Ack
	}
	// A nudge for a delivery already in hand would POST the event again (bus.InHand).
	if !h.inHand.Take(id) {
		h.log.DebugContext(ctx, "resulthandler: delivery already in hand in this instance; acked", "task_id", id)
		return bus.Ack
	}
	defer h.inHand.Delete(id)
	ctx = obs.WithTask(ctx, id)
	// The worker's nudge names the delivery lease its commit reserved for it: the first delivery
	// goes under it, without a claim of its own.
	reserved, _ := strconv.ParseInt(m.Attributes[task.AttrDeliveryEpoch], 10, 64)
	for range maxChain {
		if !h.deliverOnce(ctx, id, reserved) {
			break
		}
		reserved = 0
	}
	return bus.Ack
}

// claim is what a claim decided, acted on after it commits.
type claim struct {
	eventID, payload, url, tenant string
	owner                         string // of the lease: this instance, or protocol.NudgeOwner under a reservation
	epoch                         int64
	round, attempt                int
	known                         *protocol.Task // the task as the claim wrote or read it; the record starts from it
}

// outcome is what one POST came to.
type outcome struct {
	kind       outcomeKind
	status     int
	err        string
	retryAfter time.Duration
}

type outcomeKind int

const (
	delivered outcomeKind = iota
	retry
	dead
)

// deliverOnce claims, POSTs and records one attempt. It reports whether another event of the
// task became due at once (the next queued one started after a delivery).
func (h *Handler) deliverOnce(ctx context.Context, id string, reserved int64) bool {
	c, ok := h.claim(ctx, id, reserved)
	if !ok {
		return false
	}
	log := h.log.With("event_id", c.eventID, "attempt", c.attempt, "round", c.round)
	o := h.observedPost(ctx, c)
	// The outcome is recorded even when ctx ends (shutdown): a delivered event must be marked.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitBudget)
	defer cancel()
	next, notice, err := h.record(rctx, id, c, o)
	if err != nil {
		// The lease expires and the sweeper nudges the delivery again: at least once.
		log.ErrorContext(ctx, "resulthandler: record outcome", "status", o.status, "error", err)
		return false
	}
	log.InfoContext(ctx, "resulthandler: attempt", "status", o.status, "outcome", o.kind.String(), "error", o.err)
	if notice != nil {
		h.publishNotice(rctx, id, *notice, log)
	}
	return next
}

func (k outcomeKind) String() string {
	switch k {
	case delivered:
		return "delivered"
	case retry:
		return "retry"
	}
	return "dead"
}

// claim takes the delivery lease when the delivery is pending, due and not held; reserved, when
// not 0, is the epoch of a reservation for this nudge (protocol.Task.ReserveDelivery), which it
// delivers under when it leaves a whole POST's time, and otherwise takes over.
func (h *Handler) claim(ctx context.Context, id string, reserved int64) (claim, bool) {
	if reserved > 0 {
		if c, ok, decided := h.claimReserved(ctx, id, reserved); decided {
			return c, ok
		}
	}
	var c claim
	var ok bool
	t, err := h.store.MutateTask(ctx, id, func(t *protocol.Task, now time.Time) error {
		ok = false
		if !protocol.ClaimDelivery(t, h.policy.Owner, now, h.policy.LeaseTTL(), reserved) {
			return store.ErrNoChange
		}
		d := &t.Delivery
		c = claim{eventID: d.EventID, payload: d.Payload, url: t.CallbackURL, tenant: t.Tenant,
			owner: h.policy.Owner, epoch: d.Lease.Epoch, round: d.Round, attempt: d.Attempts}
		ok = true
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		h.log.InfoContext(ctx, "resulthandler: no such task")
		return claim{}, false
	case err != nil:
		// Contention (Aborted) or an outage: not claimed; the task's due_at still stands.
		h.log.WarnContext(ctx, "resulthandler: claim", "error", err)
		return claim{}, false
	}
	c.known = t
	return c, ok
}

// claimReserved reads the task and, when the delivery is still under the reservation named
// reserved with at least a POST's timeout left, delivers under it: the reservation is this
// nudge's claim, written by the commit that published it, so nothing is written before the POST.
// decided is false when the reservation is not usable as it is (too little time left, or another
// epoch): then claim takes it over or claims as usual.
func (h *Handler) claimReserved(ctx context.Context, id string, reserved int64) (c claim, ok, decided bool) {
	t, err := h.store.GetTask(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		h.log.InfoContext(ctx, "resulthandler: no such task")
		return claim{}, false, true
	case err != nil:
		h.log.WarnContext(ctx, "resulthandler: read the task", "error", err)
		return claim{}, false, true
	}
	d := &t.Delivery
	if d.State != task.DeliveryPending {
		return claim{}, false, true // delivered, dead or discarded meanwhile
	}
	now := h.store.Clock()
	if t.ReservedDelivery(now) != reserved || d.Lease.ExpiresAt.Sub(now) < h.policy.Timeout {
		return claim{}, false, false
	}
	return claim{eventID: d.EventID, payload: d.Payload, url: t.CallbackURL, tenant: t.Tenant,
		owner: protocol.NudgeOwner, epoch: reserved, round: d.Round, attempt: d.Attempts, known: t}, true, true
}

// post sends the frozen payload, signed, and classifies the answer.
func (h *Handler) post(ctx context.Context, c claim) outcome {
	secrets, err := h.secrets.WebhookSecrets(ctx, c.tenant)
	if err != nil {
		return outcome{kind: retry, err: "webhook secrets: " + err.Error()}
	}
	signer, err := webhook.NewSigner(secrets...)
	if err != nil {
		return outcome{kind: retry, err: "webhook secrets: " + err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, h.policy.Timeout)
	defer cancel()
	body := []byte(c.payload)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(c.payload))
	if err != nil {
		return outcome{kind: dead, err: "callback url: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "genbox-webhook/1")
	signer.SetHeaders(req.Header, c.eventID, h.Now(), body)
	resp, err := h.client.Do(req)
	if err != nil {
		if _, blocked := ssrf.IsBlocked(err); blocked {
			return outcome{kind: dead, err: err.Error()}
		}
		return outcome{kind: retry, err: err.Error()}
	}
	_, _ = io.Copy(io.Discard, resp.Body) // the client caps it; draining lets the connection be reused
	resp.Body.Close()
	return classify(resp)
}

// classify maps a receiver's answer to an outcome: 2xx delivered; 408, 429 and 5xx retried
// (honouring a Retry-After in seconds); a redirect (never followed) and every other status dead.
func classify(resp *http.Response) outcome {
	s := resp.StatusCode
	o := outcome{status: s}
	switch {
	case s >= 200 && s <= 299:
		o.kind = delivered
	case s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500:
		o.kind = retry
		o.err = http.StatusText(s)
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			o.retryAfter = time.Duration(secs) * time.Second
		}
	case s >= 300 && s <= 399:
		o.kind = dead
		o.err = ssrf.CheckResponse(resp).Error()
	default:
		o.kind = dead
		o.err = "receiver refused: " + strconv.Itoa(s) + " " + http.StatusText(s)
	}
	return o
}

// backoff is the delay before retry n (1-based): full jitter over an exponential ceiling,
// floored at BackoffMin, and at least what the receiver asked for (up to BackoffMax).
func (h *Handler) backoff(n int, retryAfter time.Duration) time.Duration {
	p := h.policy
	d := backoff.Policy{Base: p.BackoffMin, Max: p.BackoffMax, Jitter: backoff.Full}.Delay(n, h.Rand)
	return min(max(d, p.BackoffMin, retryAfter), p.BackoffMax)
}

// record commits one attempt's outcome. A delivery counts for a matching event whatever the
// lease epoch; a failure reschedules only a delivery nobody else has since claimed. It returns
// whether a queued event started and the DLQ notice to publish, if any.
func (h *Handler) record(ctx context.Context, id string, c claim, o outcome) (bool, *protocol.Notice, error) {
	var next bool
	var notice *protocol.Notice
	_, err := h.store.MutateTaskFrom(ctx, c.known, func(t *protocol.Task, now time.Time) error {
		next, notice = false, nil
		d := &t.Delivery
		if d.EventID != c.eventID || d.State != task.DeliveryPending {
			return store.ErrNoChange // finished (or discarded) meanwhile: nothing left to record
		}
		d.Log = append(d.Log, protocol.DeliveryAttempt{EventID: c.eventID, Round: c.round, At: now, Status: o.status, Error: o.err})
		if n := len(d.Log) - h.policy.LogEntries; n > 0 {
			d.Log = append(d.Log[:0:0], d.Log[n:]...)
		}
		if o.kind == delivered {
			d.State, d.DeliveredAt, d.NextAttemptAt = task.DeliveryDelivered, &now, nil
			d.LastStatus, d.LastError = o.status, ""
			d.Lease.Clear()
			t.AdvanceDelivery(now)
			next = t.Delivery.State == task.DeliveryPending
			return nil
		}
		if d.Round != c.round || (d.Lease.Live(now) && !d.Lease.HeldBy(c.owner, c.epoch, now)) {
			return nil // someone else owns the delivery now: only the log entry is ours to write
		}
		d.LastStatus, d.LastError = o.status, o.err
		d.Lease.Clear()
		first := now
		if d.FirstAttemptAt != nil {
			first = *d.FirstAttemptAt
		}
		horizon := first.Add(h.policy.Horizon)
		if o.kind == retry && now.Before(horizon) {
			at := now.Add(h.backoff(c.attempt, o.retryAfter))
			if at.After(horizon) {
				at = horizon // one last attempt at the horizon
			}
			d.NextAttemptAt = &at
			return nil
		}
		if o.kind == retry {
			d.LastError = fmt.Sprintf("horizon %s passed: %s", h.policy.Horizon, o.err)
		}
		d.State, d.NextAttemptAt = task.DeliveryDead, nil
		notice = h.addNotice(t, now)
		return nil
	})
	return next, notice, err
}

// addNotice appends the delivery's DLQ notice unless it is already there, and returns it. The
// sweeper re-sends it after NoticeGrace until the dlqnotifier has recorded it.
func (h *Handler) addNotice(t *protocol.Task, now time.Time) *protocol.Notice {
	at := now.Add(h.policy.NoticeGrace)
	n := protocol.Notice{Stage: task.StageDelivery, Replay: t.Replay, Round: t.Delivery.Round, Event: t.Delivery.EventID, NextAttemptAt: &at}
	for _, e := range t.Notices {
		if e.Announces(n) {
			return &e
		}
	}
	t.Notices = append(t.Notices, n)
	return &n
}

// publishNotice publishes a DLQ notice; on failure the sweeper re-sends it when due.
func (h *Handler) publishNotice(ctx context.Context, id string, n protocol.Notice, log *slog.Logger) {
	_, err := h.pub.Publish(ctx, bus.TopicResultsDLQ, nil, n.Attributes(id))
	if err != nil {
		log.WarnContext(ctx, "resulthandler: publish dlq notice", "error", err)
	}
}
