package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Rerun re-runs the tenant's finished tasks req.Filter matches: each gets a new replay under
// its variant's current prompt version, paced by the workers within the tenant's cap and
// budget. With req.DryRun nothing runs and the answer only counts the tasks and estimates the
// cost. A re-run without a RerunID is given a fresh one, reused by every retry of this call, so
// a retry never starts a second re-run. Its "rr_" prefix, as the API gives the re-runs it names,
// keeps it from starting with '-', which a command line would read as a flag.
func (c *Client) Rerun(ctx context.Context, req task.RerunRequest) (*task.Rerun, error) {
	if !req.DryRun && req.RerunID == "" {
		req.RerunID = "rr_" + NewIdempotencyKey()
	}
	var out task.Rerun
	if _, err := c.do(ctx, http.MethodPost, "/v1/tasks:rerun", "", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetRerun returns a re-run and its progress.
func (c *Client) GetRerun(ctx context.Context, id string) (*task.Rerun, error) {
	var out task.Rerun
	if _, err := c.do(ctx, http.MethodGet, "/v1/reruns/"+url.PathEscape(id), "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
