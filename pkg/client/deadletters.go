package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/genbox-dev/genbox/pkg/task"
)

// ListDeadLetters returns up to limit dead letters in state (open when ""), oldest first; limit
// 0 is the server's default. c must be a client of the dlqnotifier with the admin key.
func (c *Client) ListDeadLetters(ctx context.Context, state string, limit int) (*task.DeadLetterList, error) {
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
	var out task.DeadLetterList
	if _, err := c.do(ctx, http.MethodGet, path, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetDeadLetter returns one dead letter (dlqnotifier, admin key).
func (c *Client) GetDeadLetter(ctx context.Context, id string) (*task.DeadLetter, error) {
	var out task.DeadLetter
	if _, err := c.do(ctx, http.MethodGet, "/admin/dead-letters/"+url.PathEscape(id), "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DecideDeadLetter applies action (task.DeadLetterRedeliver, task.DeadLetterRegenerate or
// task.DeadLetterDiscard) to an open dead letter through the same transaction as a Slack click
// (dlqnotifier, admin key) and returns it decided. A dead letter already decided is a 409
// Problem naming who decided and when; so is a retried decision whose first attempt committed.
// operator, when not empty, is recorded beside the admin key as the name the caller gave.
func (c *Client) DecideDeadLetter(ctx context.Context, id, action, operator string) (*task.DeadLetter, error) {
	var out task.DeadLetter
	path := "/admin/dead-letters/" + url.PathEscape(id) + ":" + action
	if _, err := c.do(ctx, http.MethodPost, path, "", task.DeadLetterDecision{Operator: operator}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
