package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/genbox-dev/genbox/pkg/task"
)

// CreateSchedule creates a recurring schedule under a fresh idempotency key, reused by every
// retry of this call, so a retried create makes one schedule (and so fires once per fire time).
func (c *Client) CreateSchedule(ctx context.Context, req task.ScheduleRequest) (*task.Schedule, error) {
	return c.CreateScheduleWithKey(ctx, NewIdempotencyKey(), req)
}

// CreateScheduleWithKey creates a schedule under key: calling it again with the same key and
// request returns the same schedule; with a different request it fails with a 422 Problem.
func (c *Client) CreateScheduleWithKey(ctx context.Context, key string, req task.ScheduleRequest) (*task.Schedule, error) {
	var out task.Schedule
	if _, err := c.do(ctx, http.MethodPost, "/v1/schedules", key, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListSchedules returns one page of the tenant's schedules: up to limit (0: the server's
// default of 100) after pageToken ("" for the first page).
func (c *Client) ListSchedules(ctx context.Context, limit int, pageToken string) (*task.ScheduleList, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if pageToken != "" {
		q.Set("page_token", pageToken)
	}
	path := "/v1/schedules"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out task.ScheduleList
	if _, err := c.do(ctx, http.MethodGet, path, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSchedule returns one schedule.
func (c *Client) GetSchedule(ctx context.Context, id string) (*task.Schedule, error) {
	var out task.Schedule
	if _, err := c.do(ctx, http.MethodGet, "/v1/schedules/"+url.PathEscape(id), "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// UpdateSchedule replaces the fields p holds and returns the schedule; a Paused of true pauses
// it, false resumes it.
func (c *Client) UpdateSchedule(ctx context.Context, id string, p task.SchedulePatch) (*task.Schedule, error) {
	var out task.Schedule
	if _, err := c.do(ctx, http.MethodPatch, "/v1/schedules/"+url.PathEscape(id), "", p, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSchedule deletes a schedule: it fires no more; the tasks it fired stay.
func (c *Client) DeleteSchedule(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/v1/schedules/"+url.PathEscape(id), "", nil, nil)
	return err
}
