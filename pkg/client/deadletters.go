package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// DeadLetter is a task stage that exhausted its retries, as the dlqnotifier's admin routes show
// it: what died, what it already cost, and the decision taken on it, if any.
type DeadLetter struct {
	ID      string     `json:"id"`
	TaskID  string     `json:"task_id"`
	Tenant  string     `json:"tenant"`
	Family  string     `json:"family"`
	Variant string     `json:"variant"`
	Stage   task.Stage `json:"stage"`
	Replay  int        `json:"replay"`
	Round   int        `json:"round"`
	State   string     `json:"state"` // open, redelivered, regenerated, discarded or superseded
	// EventID and EventType name the webhook that died (delivery stage).
	EventID   string         `json:"event_id,omitempty"`
	EventType task.EventType `json:"event_type,omitempty"`
	Attempts  int            `json:"attempts"`
	LastError string         `json:"last_error,omitempty"`
	// Usage and CostUSD are what this replay already paid for.
	Usage     task.Usage `json:"usage"`
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

// ListDeadLetters returns up to limit dead letters in state (open when ""), oldest first; limit
// 0 is the server's default. c must be a client of the dlqnotifier with the admin key.
func (c *Client) ListDeadLetters(ctx context.Context, state string, limit int) (*DeadLetterList, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/admin/dead-letters"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out DeadLetterList
	if _, err := c.do(ctx, http.MethodGet, path, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetDeadLetter returns one dead letter (dlqnotifier, admin key).
func (c *Client) GetDeadLetter(ctx context.Context, id string) (*DeadLetter, error) {
	var out DeadLetter
	if _, err := c.do(ctx, http.MethodGet, "/admin/dead-letters/"+url.PathEscape(id), "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DecideDeadLetter applies action (DeadLetterRedeliver, DeadLetterRegenerate or
// DeadLetterDiscard) to an open dead letter through the same transaction as a Slack click
// (dlqnotifier, admin key) and returns it decided. A dead letter already decided is a 409
// Problem naming who decided and when; so is a retried decision whose first attempt committed.
// operator, when not empty, is recorded beside the admin key as the name the caller gave.
func (c *Client) DecideDeadLetter(ctx context.Context, id, action, operator string) (*DeadLetter, error) {
	var out DeadLetter
	path := "/admin/dead-letters/" + url.PathEscape(id) + ":" + action
	if _, err := c.do(ctx, http.MethodPost, path, "", DeadLetterDecision{Operator: operator}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
