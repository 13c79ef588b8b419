package protocol

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/safetext"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Task is the tasks/{task_id} document: the task, its generation outbox, its webhook delivery,
// its DLQ notices and any human decision whose effects are not yet carried out.
type Task struct {
	ID         string    `firestore:"-"`
	UpdateTime time.Time `firestore:"-"` // the document's update time when read; guards unlocked writes

	Tenant         string            `firestore:"tenant"`
	Family         string            `firestore:"family"`
	Variant        string            `firestore:"variant"`
	PromptVersion  string            `firestore:"prompt_version,omitempty"`
	Input          string            `firestore:"input"`
	SubjectKey     string            `firestore:"subject_key,omitempty"`
	ModelChain     []string          `firestore:"model_chain,omitempty"`
	GenConfig      *task.GenConfig   `firestore:"gen_config,omitempty"`
	CallbackURL    string            `firestore:"callback_url,omitempty"`
	Labels         map[string]string `firestore:"labels,omitempty"`
	Cache          bool              `firestore:"cache"`
	RunBefore      *time.Time        `firestore:"run_before,omitempty"`
	MaxCostUSD     *float64          `firestore:"max_cost_usd,omitempty"`
	IdempotencyKey string            `firestore:"idempotency_key,omitempty"`
	RequestHash    string            `firestore:"request_hash,omitempty"`
	Fingerprint    string            `firestore:"fingerprint,omitempty"`
	// Mode is the task's effective mode (the request's, else its family's); "" is standard.
	Mode task.Mode `firestore:"mode,omitempty"`
	// Stream: the worker streams the generation and publishes previews (previews/{task_id}).
	Stream bool `firestore:"stream,omitempty"`
	// TraceID is the trace of the submission, for finding the task's spans.
	TraceID string `firestore:"trace_id,omitempty"`
	// Files are the task's input files, resolved at submit (File).
	Files []File `firestore:"files,omitempty"`

	// Priority orders a tenant's tasks waiting for a slot, higher first (task.MinPriority to
	// task.MaxPriority; the publisher writes task.DefaultPriority when the request names none).
	Priority int `firestore:"priority"`

	// Slot: the task holds one of its tenant's concurrency slots (tenant_slots/{tenant}); it is
	// set only while the task runs, and the write that ends its run passes the slot on (store/slots.go).
	Slot bool `firestore:"slot,omitempty"`
	// AwaitsSlot marks a queued task waiting for one of its tenant's slots: it is not claimed or
	// rewritten until a running task of its tenant ends and hands it the slot, or its not_before
	// (the safety net, GENBOX_TENANT_WAIT_MAX) passes.
	AwaitsSlot bool `firestore:"awaits_slot,omitempty"`

	State    task.State  `firestore:"state"`
	Attempts int         `firestore:"attempts"`        // failed generation attempts of this replay
	Claims   int         `firestore:"claims"`          // takeovers of an expired lease since the last clean release
	Replay   int         `firestore:"replay"`          // bumped by Regenerate
	Parks    int         `firestore:"parks"`           // consecutive parks (every model unavailable); sizes the park backoff
	Sheds    int         `firestore:"sheds,omitempty"` // consecutive flex sheds; sizes the shed backoff
	Lease    claim.Lease `firestore:"lease"`

	// Batch mode: BatchModel is set while the task waits for a batch of that model (queued);
	// BatchJob names the batch_jobs document it runs in (running under the job's lease) or ran in.
	BatchModel string `firestore:"batch_model,omitempty"`
	BatchJob   string `firestore:"batch_job,omitempty"`
	// BatchOnline sends a batch task online: a batch could not serve it (its job was refused, or
	// its output failed the validator under conditions another batch would repeat).
	BatchOnline bool `firestore:"batch_online,omitempty"`

	// Scheduling. DueAt is derived by Finalize, never set by hand. StartAfter is a delayed task's
	// start time: its not_before while it is scheduled.
	DueAt        *time.Time `firestore:"due_at,omitempty"`
	DueShard     int        `firestore:"due_shard"` // the sweep shard whose leader finds it (Shard)
	NotBefore    *time.Time `firestore:"not_before,omitempty"`
	Nudges       int        `firestore:"nudges"`             // sweeper nudges since the last progress
	NudgeAt      *time.Time `firestore:"nudge_at,omitempty"` // no sweeper nudge before this
	PendingSince *time.Time `firestore:"pending_since,omitempty"`
	StartAfter   *time.Time `firestore:"start_after,omitempty"`

	// Generation outcome of the current replay. OutputAt != nil means the output is stored.
	Output      string     `firestore:"output,omitempty"`
	OutputEpoch int64      `firestore:"output_epoch,omitempty"`
	OutputAt    *time.Time `firestore:"output_at,omitempty"`
	Usage       task.Usage `firestore:"usage"`
	InDoubt     task.Usage `firestore:"in_doubt"` // estimated tokens of calls that may have been billed
	ModelCalls  int        `firestore:"model_calls"`
	SpentBy     []string   `firestore:"spent_by,omitempty"` // owner:epoch of each call whose spend is recorded (once)
	CostUSD     float64    `firestore:"cost_usd"`
	Model       string     `firestore:"model,omitempty"`
	// Tier is the service tier that served the output's call (the response's trafficType): a
	// priority task may have been served on the standard tier, and was charged for that one.
	Tier     string       `firestore:"tier,omitempty"`
	Degraded bool         `firestore:"degraded"`
	Stale    bool         `firestore:"stale"`
	CacheHit bool         `firestore:"cache_hit"`
	Error    *TaskError   `firestore:"error,omitempty"`
	Previous []Generation `firestore:"previous,omitempty"`
	// AttemptLog records the latest model calls of every replay (at most MaxAttemptLog).
	AttemptLog []AttemptRecord `firestore:"attempt_log,omitempty"`

	Delivery        Delivery  `firestore:"delivery"`
	Notices         []Notice  `firestore:"dlq_notices,omitempty"`
	OpenDeadLetters []string  `firestore:"open_dead_letters,omitempty"`
	Decision        *Decision `firestore:"decision,omitempty"`
	SlackUpdate     *Pending  `firestore:"slack_update,omitempty"`
	// FileErase lists the Files API copies of an erased task (their names) a worker has yet to
	// delete (QueueCopyErase).
	FileErase *Pending `firestore:"file_erase,omitempty"`

	CreatedAt   time.Time  `firestore:"created_at"`
	UpdatedAt   time.Time  `firestore:"updated_at"`
	CompletedAt *time.Time `firestore:"completed_at,omitempty"`
	ExpireAt    *time.Time `firestore:"expire_at,omitempty"`
	ErasedAt    *time.Time `firestore:"erased_at,omitempty"` // DELETE /v1/tasks/{id} erased the content

	// BypassCache makes the next run skip the output cache: set by Regenerate, whose point is a
	// fresh generation.
	BypassCache bool `firestore:"bypass_cache,omitempty"`
	// Rerun is the reruns/{id} document that started the current replay (StartRerun).
	Rerun string `firestore:"rerun,omitempty"`
}

// TaskError is a task's last error.
type TaskError struct {
	Kind    task.ErrorKind `firestore:"kind"`
	Code    int            `firestore:"code,omitempty"`
	Message string         `firestore:"message"`
}

// Generation is the outcome of an earlier replay, kept when Regenerate starts a new one.
type Generation struct {
	Replay int `firestore:"replay"`
	// PromptVersion is the prompt version the replay ran under, when a re-run replaced it.
	PromptVersion string `firestore:"prompt_version,omitempty"`
	// LastEpoch is the lease epoch of the replay's last claim: a call made under an epoch up to
	// it belongs to this replay (epochs rise across replays), 0 when not recorded.
	LastEpoch   int64      `firestore:"last_epoch,omitempty"`
	Output      string     `firestore:"output,omitempty"`
	OutputEpoch int64      `firestore:"output_epoch,omitempty"`
	Usage       task.Usage `firestore:"usage"`
	CostUSD     float64    `firestore:"cost_usd"`
	Model       string     `firestore:"model,omitempty"`
	State       task.State `firestore:"state"`
	Error       *TaskError `firestore:"error,omitempty"`
	CompletedAt *time.Time `firestore:"completed_at,omitempty"`
}

// MaxAttemptLog bounds a task's attempt log: the document stays far below Firestore's limit.
const MaxAttemptLog = 32

// AttemptRecord is one model call of a task, as the console shows it.
type AttemptRecord struct {
	Replay  int        `firestore:"replay"`
	Epoch   int64      `firestore:"epoch"`
	Number  int        `firestore:"number"` // within the call's attempt budget; 1 is the first call
	Model   string     `firestore:"model"`
	Class   string     `firestore:"class,omitempty"` // the failure class; "" when the model answered
	Latency int64      `firestore:"latency_ms"`
	Usage   task.Usage `firestore:"usage"`
	CostUSD float64    `firestore:"cost_usd"`
	At      time.Time  `firestore:"at"`
}

// LogAttempts appends calls to the attempt log, keeping the latest MaxAttemptLog.
func (t *Task) LogAttempts(calls ...AttemptRecord) {
	t.AttemptLog = append(t.AttemptLog, calls...)
	if n := len(t.AttemptLog) - MaxAttemptLog; n > 0 {
		t.AttemptLog = append([]AttemptRecord(nil), t.AttemptLog[n:]...)
	}
}

// Delivery is the webhook outbox of a task: the event in flight, and newer events queued behind it.
type Delivery struct {
	State          task.DeliveryState `firestore:"state"`
	EventID        string             `firestore:"event_id,omitempty"`
	EventType      task.EventType     `firestore:"event_type,omitempty"`
	Payload        string             `firestore:"payload,omitempty"` // frozen when the event was queued
	Round          int                `firestore:"round"`             // Redelivers of this event
	Attempts       int                `firestore:"attempts"`
	FirstAttemptAt *time.Time         `firestore:"first_attempt_at,omitempty"`
	NextAttemptAt  *time.Time         `firestore:"next_attempt_at,omitempty"`
	Lease          claim.Lease        `firestore:"lease"`
	LastStatus     int                `firestore:"last_status,omitempty"`
	LastError      string             `firestore:"last_error,omitempty"`
	DeliveredAt    *time.Time         `firestore:"delivered_at,omitempty"`
	Log            []DeliveryAttempt  `firestore:"log,omitempty"`
	Queue          []QueuedEvent      `firestore:"queue,omitempty"`
}

// DeliveryAttempt records one POST of a webhook.
type DeliveryAttempt struct {
	EventID string    `firestore:"event_id"`
	Round   int       `firestore:"round"`
	At      time.Time `firestore:"at"`
	Status  int       `firestore:"status,omitempty"`
	Error   string    `firestore:"error,omitempty"`
}

// QueuedEvent is an event waiting for the one in flight to end.
type QueuedEvent struct {
	EventID string         `firestore:"event_id"`
	Type    task.EventType `firestore:"type"`
	Payload string         `firestore:"payload"`
}

// Notice is a DLQ notice kept as an outbox on the task until the dlqnotifier has recorded and
// posted its dead letter and cleared it.
type Notice struct {
	Stage  task.Stage `firestore:"stage"`
	Replay int        `firestore:"replay"`
	Round  int        `firestore:"round"`
	// Event is the webhook event whose delivery died (delivery stage; empty on a notice recorded
	// before notices named it).
	Event         string      `firestore:"event_id,omitempty"`
	NextAttemptAt *time.Time  `firestore:"next_attempt_at,omitempty"`
	Lease         claim.Lease `firestore:"lease"`
}

// Announces reports whether n and o announce the same dead letter.
func (n Notice) Announces(o Notice) bool {
	return n.Stage == o.Stage && n.Replay == o.Replay && n.Round == o.Round && n.Event == o.Event
}

// Decision is a human's decision on a dead letter whose nudges are not yet all published.
type Decision struct {
	DeadLetterID  string     `firestore:"dead_letter_id"`
	Action        string     `firestore:"action"`
	By            string     `firestore:"by"`
	At            time.Time  `firestore:"at"`
	Topics        []string   `firestore:"topics,omitempty"` // nudges still to publish
	NextAttemptAt *time.Time `firestore:"next_attempt_at,omitempty"`
}

// Pending is a piece of follow-up work the sweeper carries until done.
type Pending struct {
	Keys          []string   `firestore:"keys,omitempty"`
	NextAttemptAt *time.Time `firestore:"next_attempt_at,omitempty"`
}

// Clone returns a deep copy of t: nothing it points to is shared with t.
func (t *Task) Clone() *Task {
	c := new(Task)
	deepCopy(reflect.ValueOf(c).Elem(), reflect.ValueOf(t).Elem())
	return c
}

// deepCopy sets dst to a copy of src that shares no pointer, slice or map with it. A struct is
// copied whole first, so its unexported fields (a time.Time's) are kept as they are.
func deepCopy(dst, src reflect.Value) {
	switch src.Kind() {
	case reflect.Pointer:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		p := reflect.New(src.Elem().Type())
		deepCopy(p.Elem(), src.Elem())
		dst.Set(p)
	case reflect.Slice:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		s := reflect.MakeSlice(src.Type(), src.Len(), src.Len())
		for i := range src.Len() {
			deepCopy(s.Index(i), src.Index(i))
		}
		dst.Set(s)
	case reflect.Map:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		m := reflect.MakeMapWithSize(src.Type(), src.Len())
		for iter := src.MapRange(); iter.Next(); {
			v := reflect.New(iter.Value().Type()).Elem()
			deepCopy(v, iter.Value())
			m.SetMapIndex(iter.Key(), v)
		}
		dst.Set(m)
	case reflect.Interface:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		v := reflect.New(src.Elem().Type()).Elem()
		deepCopy(v, src.Elem())
		dst.Set(v)
	case reflect.Struct:
		dst.Set(src)
		for i := range src.NumField() {
			if dst.Field(i).CanSet() {
				deepCopy(dst.Field(i), src.Field(i))
			}
		}
	default:
		dst.Set(src)
	}
}

// HasOutput reports whether the current replay's output is stored.
func (t *Task) HasOutput() bool { return t.OutputAt != nil }

// View returns the task as the REST API and webhook payloads show it.
func (t *Task) View() task.View {
	v := task.View{
		TaskID: t.ID, State: t.State, Family: t.Family, Variant: t.Variant, Labels: t.Labels,
		Usage: t.Usage, CostUSD: t.CostUSD, Model: t.Model, Tier: t.Tier, Degraded: t.Degraded, Stale: t.Stale,
		CacheHit: t.CacheHit, Replay: t.Replay, Mode: t.Mode, BatchJob: t.BatchJob, Files: fileViews(t.Files),
		Delivery:  task.DeliveryView{State: t.Delivery.State, Attempts: t.Delivery.Attempts},
		CreatedAt: t.CreatedAt, StartAfter: t.StartAfter, CompletedAt: t.CompletedAt,
	}
	if v.Delivery.State == "" {
		v.Delivery.State = task.DeliveryNone
	}
	if v.Delivery.State == task.DeliveryDead {
		v.Delivery.LastStatus, v.Delivery.LastError = t.Delivery.LastStatus, t.Delivery.LastError
	}
	if v.Mode == "" {
		v.Mode = task.ModeStandard
	}
	if t.HasOutput() {
		out := t.Output
		v.Output = &out
	}
	if t.Error != nil {
		v.Error = &task.ErrorView{Kind: t.Error.Kind, Message: t.Error.Message}
	}
	return v
}

// Finish moves the task into an end state at now: it frees the lease and backoff, stamps
// completed_at, and queues the state's webhook event. Set output, usage and error first: the event
// payload is frozen from the task as it is when Finish runs.
func (t *Task) Finish(state task.State, now time.Time) {
	t.State = state
	t.Lease.Clear()
	t.NotBefore = nil
	t.CompletedAt = &now
	t.QueueEvent(state.Event(), now)
}

// boundText bounds the error texts of t with safetext.Error: its error (and those of earlier
// replays), its delivery's last error and log. Services build these from what models and
// receivers answered; bounding them here, where an event freezes them into its payload and where
// Finalize readies every write, keeps the document below Firestore's 1 MiB however the text came.
func (t *Task) boundText() {
	boundError(t.Error)
	for i := range t.Previous {
		boundError(t.Previous[i].Error)
	}
	d := &t.Delivery
	d.LastError = safetext.Error(d.LastError)
	for i := range d.Log {
		d.Log[i].Error = safetext.Error(d.Log[i].Error)
	}
}

func boundError(e *TaskError) {
	if e != nil {
		e.Message = safetext.Error(e.Message)
	}
}

// Request is the model request for t, its prompt rendered as r: t's own model chain where it names
// one, and its max_cost_usd. The worker sends it and the dlqnotifier prices Regenerate with it, so
// the price shown is the one the worker will check.
func (t *Task) Request(r *prompts.Rendered) gemini.Request {
	req := gemini.NewRequest(t.ID, t.Tenant, r)
	req.Files = modelFiles(t.Files)
	if t.Mode == task.ModePriority {
		req.Tier = gemini.TierPriority
	}
	if len(t.ModelChain) > 0 {
		req.Models = t.ModelChain
	}
	if t.MaxCostUSD != nil {
		req.MaxCostUSD = *t.MaxCostUSD
	}
	return req
}

// NudgeOwner owns a delivery lease that a commit reserved for the gemini-results nudge it
// publishes (ReserveDelivery).
const NudgeOwner = "nudge"

// DeliveryLease is how long a delivery lease lasts for a webhook timeout (GENBOX_WEBHOOK_TIMEOUT):
// three timeouts, so that a live holder is never overtaken while its POST may still be in flight,
// and a dead one holds the delivery no longer. A resulthandler's claim and the reservation of the
// commit that ends a task (ReserveDelivery) both last it: whoever dies holding a delivery, it is
// due again within one lease (docs/liveness.md).
func DeliveryLease(webhookTimeout time.Duration) time.Duration { return 3 * webhookTimeout }

// ReserveDelivery folds the delivery claim into the commit that starts the delivery: when the
// pending delivery is claimable now (no live lease, no retry backoff), it takes the delivery lease
// for the nudge the writer publishes after its commit, until now+ttl (DeliveryLease), as the
// resulthandler's claim would (attempts + 1, first_attempt_at). The resulthandler that receives
// that nudge — it carries the epoch, task.AttrDeliveryEpoch — delivers under the reservation
// without a write of its own; if the nudge is lost (or dies with the process carrying it), the
// delivery is due when the reservation expires and the sweeper nudges it. It returns the
// reservation's epoch, or 0 when there is nothing to reserve.
func (t *Task) ReserveDelivery(now time.Time, ttl time.Duration) int64 {
	d := &t.Delivery
	if !d.Claimable(now, 0) || d.Take(NudgeOwner, now, ttl) != nil {
		return 0
	}
	return d.Lease.Epoch
}

// Take takes the delivery lease for owner until now+ttl and counts the attempt it is for; it
// fails with claim.ErrHeld, changing nothing, while another owner's lease is live. Check
// Claimable first: a reservation's (ReserveDelivery) and a claim's (ClaimDelivery) take
// are this one.
func (d *Delivery) Take(owner string, now time.Time, ttl time.Duration) error {
	if err := d.Lease.Take(owner, now, ttl); err != nil {
		return err
	}
	if d.FirstAttemptAt == nil {
		d.FirstAttemptAt = &now
	}
	d.Attempts++
	return nil
}

// ReservedDelivery returns the epoch of the delivery lease a commit reserved for its nudge while
// that reservation is live at now, else 0.
func (t *Task) ReservedDelivery(now time.Time) int64 {
	if t.Delivery.State != task.DeliveryPending || t.Delivery.Lease.Owner != NudgeOwner || !t.Delivery.Lease.Live(now) {
		return 0
	}
	return t.Delivery.Lease.Epoch
}

// QueueEvent queues a webhook event, frozen from the task as it is now. Without a callback URL
// there is nothing to deliver. A newer event waits behind a pending one and never overwrites it.
func (t *Task) QueueEvent(typ task.EventType, now time.Time) {
	if t.CallbackURL == "" {
		t.Delivery.State = task.DeliveryNone
		return
	}
	t.boundText()
	payload, err := json.Marshal(task.Event{Type: typ, Timestamp: now.UTC(), Data: t.View()})
	if err != nil {
		panic("protocol: marshal event: " + err.Error()) // a View always marshals
	}
	ev := QueuedEvent{EventID: task.EventID(t.ID, typ, t.Replay), Type: typ, Payload: string(payload)}
	if t.Delivery.State == task.DeliveryPending {
		t.Delivery.Queue = append(t.Delivery.Queue, ev)
		return
	}
	t.Delivery.start(ev, now)
}

// Regenerate moves the dead replay's outcome into Previous and queues a fresh generation:
// attempts and claims reset, replay + 1 (so its event has a new webhook-id), cache bypassed. The
// replay's last epoch is kept with it, so that what a late call of the replay spent is charged
// to it (EarlierReplay).
func (t *Task) Regenerate() {
	t.Previous = append(t.Previous, Generation{
		Replay: t.Replay, LastEpoch: t.Lease.Epoch, Output: t.Output, OutputEpoch: t.OutputEpoch, Usage: t.Usage, CostUSD: t.CostUSD,
		Model: t.Model, State: t.State, Error: t.Error, CompletedAt: t.CompletedAt,
	})
	t.Output, t.OutputEpoch, t.OutputAt = "", 0, nil
	t.Usage, t.CostUSD, t.Model, t.Tier = task.Usage{}, 0, "", ""
	t.Degraded, t.Stale, t.CacheHit = false, false, false
	t.Error, t.CompletedAt = nil, nil
	t.State = task.StateQueued
	t.Attempts, t.Claims, t.Parks = 0, 0, 0
	t.NotBefore = nil
	t.Lease.Clear()
	t.Replay++
	t.BypassCache = true
}

// EarlierReplay returns the earlier replay a call made under lease epoch belongs to, or nil when
// it belongs to the current one: a zombie of an earlier replay is charged to that replay, not
// to the one that replaced it.
func (t *Task) EarlierReplay(epoch int64) *Generation {
	for i := range t.Previous {
		if epoch <= t.Previous[i].LastEpoch {
			return &t.Previous[i]
		}
	}
	return nil
}

// AdvanceDelivery starts the next queued event after the current one has ended, if any.
func (t *Task) AdvanceDelivery(now time.Time) {
	if t.Delivery.State == task.DeliveryPending || len(t.Delivery.Queue) == 0 {
		return
	}
	next := t.Delivery.Queue[0]
	t.Delivery.Queue = t.Delivery.Queue[1:]
	t.Delivery.start(next, now)
}

func (d *Delivery) start(ev QueuedEvent, now time.Time) {
	d.State = task.DeliveryPending
	d.EventID, d.EventType, d.Payload = ev.EventID, ev.Type, ev.Payload
	d.Round, d.Attempts = 0, 0
	d.FirstAttemptAt, d.DeliveredAt = nil, nil
	d.NextAttemptAt = &now
	d.LastStatus, d.LastError = 0, ""
	d.Lease.Clear()
}

// BatchOwner is the lease owner of the tasks of batch job id: the job, not a process, so that
// any batcher leading its model renews and settles them at their claim epoch.
func BatchOwner(id string) string { return BatchOwnerPrefix + id }

// BatchOwnerPrefix starts the lease owner of a task inside a batch job.
const BatchOwnerPrefix = "batch:"

// InBatchJob reports whether a running task is held by a batch job's lease: only the batcher
// that leads its model settles it (a worker never takes it over), and it may be cancelled while
// the job runs (the job's answer then records its cost and delivers nothing).
func (t *Task) InBatchJob() bool {
	return t.State == task.StateRunning && strings.HasPrefix(t.Lease.Owner, BatchOwnerPrefix)
}

// AwaitSlot marks t, queued, waiting for one of its tenant's slots until at the latest until:
// nobody claims or rewrites it before a hand-off claims it, a recheck admits it or until passes
// (the sweeper's safety net).
func (t *Task) AwaitSlot(until time.Time) {
	t.State, t.AwaitsSlot, t.NotBefore, t.Claims = task.StateQueued, true, &until, 0
}

// StartRerun starts a new replay of t for re-run id, as Regenerate does for a dead letter (the
// earlier outcome kept in previous[], a fresh generation), under promptVersion, the variant's
// current version; the task then carries id, so a page the pacer replays after a crash finds
// it started already. The sweeper leaves it until hold, while the pacer's nudge is in flight.
func (t *Task) StartRerun(id, promptVersion string, hold time.Time) {
	t.Regenerate()
	t.Previous[len(t.Previous)-1].PromptVersion = t.PromptVersion
	t.PromptVersion = promptVersion
	t.Rerun = id
	t.NudgeAt = &hold
}

// Erase removes the task's content — input, output, outputs of earlier replays, and the output
// inside queued webhook payloads — and keeps its accounting (usage, cost, model, states, times).
// Only a finished task may be erased: the worker never writes it again.
func (t *Task) Erase(now time.Time) {
	t.Input, t.Output, t.OutputAt = "", "", nil
	t.SubjectKey = ""
	for i := range t.Previous {
		t.Previous[i].Output = ""
	}
	t.Delivery.Payload = erasePayload(t.Delivery.Payload)
	for i := range t.Delivery.Queue {
		t.Delivery.Queue[i].Payload = erasePayload(t.Delivery.Queue[i].Payload)
	}
	t.ErasedAt = &now
}

// erasePayload drops the output from a frozen webhook payload; the event keeps its id and type.
func erasePayload(p string) string {
	if p == "" {
		return p
	}
	var ev task.Event
	if err := json.Unmarshal([]byte(p), &ev); err != nil {
		return ""
	}
	ev.Data.Output = nil
	b, err := json.Marshal(ev)
	if err != nil {
		return ""
	}
	return string(b)
}
