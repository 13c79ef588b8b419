package task

import (
	"fmt"
	"strings"
	"time"
)

// ProblemContentType is the media type of error responses (RFC 9457).
const ProblemContentType = "application/problem+json"

// Headers of the REST API beyond the standard ones.
const (
	// HeaderIdempotencyKey names the intent of a submission: one task per key and tenant.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a response that returns the task an earlier request with the
	// same Idempotency-Key created.
	HeaderReplayed = "Idempotent-Replayed"
)

// MaxBatch is the largest number of tasks one POST /v1/tasks:batch may carry.
const MaxBatch = 100

// MaxDelay is how far ahead of its submission a task's start_after may be (30 days).
const MaxDelay = 30 * 24 * time.Hour

// Problem is an error response of the REST API (RFC 9457 problem details). Every non-2xx answer
// carries one; the Go client returns it as the error.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Errors names each request field that was refused, and why.
	Errors []FieldError `json:"errors,omitempty"`
	// RetryAfter is the server's Retry-After on a 429 or 503 (not part of the body).
	RetryAfter time.Duration `json:"-"`
}

// FieldError is one refused field of a request: a dotted JSON path (e.g. "config.temperature")
// or a header name.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// Error describes the problem in one line.
func (p *Problem) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "genbox: %d %s", p.Status, p.Title)
	if p.Detail != "" {
		b.WriteString(": " + p.Detail)
	}
	for _, f := range p.Errors {
		fmt.Fprintf(&b, "; %s: %s", f.Field, f.Detail)
	}
	return b.String()
}

// SubmitResponse is the answer to a submission: 202 for a new task, 200 for a replayed one.
type SubmitResponse struct {
	TaskID    string `json:"task_id"`
	State     State  `json:"state"`
	StatusURL string `json:"status_url"`
	// Replayed is true when an earlier request with the same Idempotency-Key created the task
	// (from the Idempotent-Replayed header; not part of the body).
	Replayed bool `json:"-"`
}

// BatchRequest is the body of POST /v1/tasks:batch.
type BatchRequest struct {
	Tasks []Request `json:"tasks"`
}

// BatchResponse is the answer to a batch: one result per request, in order.
type BatchResponse struct {
	Results []BatchResult `json:"results"`
}

// BatchResult is the outcome of one request of a batch: Status is what a single POST /v1/tasks
// would have answered; a refused request carries its Problem instead of a task.
type BatchResult struct {
	Index     int      `json:"index"`
	Status    int      `json:"status"`
	TaskID    string   `json:"task_id,omitempty"`
	State     State    `json:"state,omitempty"`
	StatusURL string   `json:"status_url,omitempty"`
	Replayed  bool     `json:"replayed,omitempty"`
	Problem   *Problem `json:"problem,omitempty"`
}

// List is a page of GET /v1/tasks, newest first.
type List struct {
	Tasks []View `json:"tasks"`
	// NextPageToken is opaque; empty on the last page.
	NextPageToken string `json:"next_page_token,omitempty"`
}

// StreamEvent is one event of GET /v1/tasks/{id}/events (Server-Sent Events): the SSE event
// name is Type, its data this struct as JSON. ID is the SSE id — the task document's update
// time — that Last-Event-ID resumes after; a preview has none.
type StreamEvent struct {
	ID        string    `json:"-"`
	Type      EventType `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	// Attempts counts the failed generation attempts of the task's current replay.
	Attempts int `json:"attempts"`
	// Task is the task as GET /v1/tasks/{id} shows it; nil on a preview.
	Task *View `json:"task,omitempty"`
	// Preview is the streamed text so far, on a task.preview event only.
	Preview string `json:"preview,omitempty"`
}

// Final reports whether e ends the stream: its task has finished and its delivery is settled.
func (e StreamEvent) Final() bool {
	return e.Task != nil && e.Task.State.Finished() && e.Task.Delivery.State != DeliveryPending
}

// Limits are a tenant's quotas; zero means no limit.
type Limits struct {
	Concurrency int `json:"concurrency"`
	// Weight is the tenant's part of the worker pool's slots when tenants together want more
	// than it holds: each gets slots in proportion to its weight; absent or 0: 1.
	Weight         int     `json:"weight,omitempty"`
	SubmitRate     float64 `json:"submit_rate"`
	SubmitBurst    int     `json:"submit_burst"`
	DailyBudgetUSD float64 `json:"daily_budget_usd"`
	// RPM and TPM are the tenant's share of the model quota: model calls and tokens (prompt plus
	// output) per minute, across every worker instance.
	RPM int64 `json:"rpm,omitempty"`
	TPM int64 `json:"tpm,omitempty"`
	// AllowedBuckets are the Cloud Storage buckets whose objects the tenant's tasks may name by
	// gs:// URI (besides its own uploads); none by default.
	AllowedBuckets []string `json:"allowed_buckets,omitempty"`
}

// CreateTenantRequest is the body of POST /admin/v1/tenants.
type CreateTenantRequest struct {
	ID string `json:"id"`
	// Limits default to the server's defaults when nil.
	Limits *Limits `json:"limits,omitempty"`
}

// SecretInfo describes a webhook secret without revealing it.
type SecretInfo struct {
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Tenant is a tenant as the admin API shows it.
type Tenant struct {
	ID             string       `json:"id"`
	Limits         Limits       `json:"limits"`
	WebhookSecrets []SecretInfo `json:"webhook_secrets"`
	CreatedAt      time.Time    `json:"created_at"`
	// WebhookSecret is the first signing secret, shown only in the answer to the creation.
	WebhookSecret string `json:"webhook_secret,omitempty"`
}

// APIKey describes an API key. Key is set only in the answer to its creation: it is stored only
// as a hash and cannot be shown again.
type APIKey struct {
	KeyID     string     `json:"key_id"`
	Key       string     `json:"key,omitempty"`
	Tenant    string     `json:"tenant"`
	Revoked   bool       `json:"revoked"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// RotatedSecret is the answer to a webhook secret rotation: the new secret (shown once), and
// until when the earlier ones keep signing alongside it.
type RotatedSecret struct {
	Tenant           string    `json:"tenant"`
	WebhookSecret    string    `json:"webhook_secret"`
	PreviousExpireAt time.Time `json:"previous_expire_at"`
}

// DeadLetter is a task stage that exhausted its retries, as the dlqnotifier's admin routes show
// it: what died, what it already cost, and the decision taken on it, if any.
type DeadLetter struct {
	ID      string `json:"id"`
	TaskID  string `json:"task_id"`
	Tenant  string `json:"tenant"`
	Family  string `json:"family"`
	Variant string `json:"variant"`
	Stage   Stage  `json:"stage"`
	Replay  int    `json:"replay"`
	Round   int    `json:"round"`
	State   string `json:"state"` // open, redelivered, regenerated, discarded or superseded
	// EventID and EventType name the webhook that died (delivery stage).
	EventID   string    `json:"event_id,omitempty"`
	EventType EventType `json:"event_type,omitempty"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
	// Usage and CostUSD are what this replay already paid for.
	Usage     Usage      `json:"usage"`
	CostUSD   float64    `json:"cost_usd"`
	DecidedBy string     `json:"decided_by,omitempty"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	// Applied is true once the decision's nudges are all published.
	Applied   bool      `json:"applied"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DeadLetterList is the answer of GET /admin/dead-letters, oldest first.
type DeadLetterList struct {
	DeadLetters []DeadLetter `json:"dead_letters"`
}

// DeadLetterDecision is the optional body of POST /admin/dead-letters/{id}:{action}. The
// decision is recorded as the admin key's; Operator, when set, is kept beside it as the name
// the caller gave, unverified.
type DeadLetterDecision struct {
	Operator string `json:"operator,omitempty"`
}

// Decisions on a dead letter: Redeliver and Discard apply to the delivery stage, Regenerate and
// Discard to the generation stage.
const (
	DeadLetterRedeliver  = "redeliver"
	DeadLetterRegenerate = "regenerate"
	DeadLetterDiscard    = "discard"
)
