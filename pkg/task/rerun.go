package task

import "time"

// RerunFilter selects the finished tasks of the caller's tenant that a re-run replays: every
// field that is set must match. Labels match when the task carries each of them.
type RerunFilter struct {
	State         State             `json:"state,omitempty" firestore:"state,omitempty"`
	Family        string            `json:"family,omitempty" firestore:"family,omitempty"`
	Variant       string            `json:"variant,omitempty" firestore:"variant,omitempty"`
	Labels        map[string]string `json:"labels,omitempty" firestore:"labels,omitempty"`
	CreatedAfter  *time.Time        `json:"created_after,omitempty" firestore:"created_after,omitempty"`
	CreatedBefore *time.Time        `json:"created_before,omitempty" firestore:"created_before,omitempty"`
	PromptVersion string            `json:"prompt_version,omitempty" firestore:"prompt_version,omitempty"`
}

// RerunRequest is the body of POST /v1/tasks:rerun. With DryRun nothing runs: the answer counts
// the matching tasks and estimates their cost. Otherwise a re-run is created; RerunID (or the
// Idempotency-Key header) names it, so a retried request returns the same re-run.
type RerunRequest struct {
	Filter  RerunFilter `json:"filter"`
	DryRun  bool        `json:"dry_run,omitempty"`
	RerunID string      `json:"rerun_id,omitempty"`
}

// RerunState is where a re-run is.
type RerunState string

// Re-run states.
const (
	RerunRunning   RerunState = "running"
	RerunCompleted RerunState = "completed"
)

// RerunProgress counts what a re-run has done: the tasks its pacer found matching so far, those
// it started a new replay of, those it skipped (running again already, erased, awaiting an
// operator's decision, or of a retired variant), and how many of the started ones ended
// succeeded (Done) or otherwise (Failed).
type RerunProgress struct {
	Matched int `json:"matched" firestore:"matched"`
	Started int `json:"started" firestore:"started"`
	Skipped int `json:"skipped" firestore:"skipped"`
	Done    int `json:"done" firestore:"done"`
	Failed  int `json:"failed" firestore:"failed"`
}

// Rerun is the answer of POST /v1/tasks:rerun and GET /v1/reruns/{id}: Count and
// EstimatedCostUSD as estimated when it was asked for (a dry run has no RerunID, State or
// Progress).
type Rerun struct {
	RerunID string      `json:"rerun_id,omitempty"`
	DryRun  bool        `json:"dry_run,omitempty"`
	State   RerunState  `json:"state,omitempty"`
	Filter  RerunFilter `json:"filter"`
	// Count is the number of tasks that matched and could be re-run.
	Count int `json:"count"`
	// EstimatedCostUSD prices one more generation of each: its recorded token counts at the
	// price table's rates for the model that served it, or, for a task no model answered, the
	// worst case of its rendered prompt (the Regenerate button's estimate).
	EstimatedCostUSD float64        `json:"estimated_cost_usd"`
	Progress         *RerunProgress `json:"progress,omitempty"`
	StatusURL        string         `json:"status_url,omitempty"`
	CreatedAt        *time.Time     `json:"created_at,omitempty"`
	CompletedAt      *time.Time     `json:"completed_at,omitempty"`
}
