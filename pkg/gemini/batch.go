package gemini

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/task"
)

// BatchKey is the metadata key that carries each request's task id through a batch job: the
// job echoes a request's metadata on its response.
const BatchKey = "key"

// Batch job states, as the genai SDK reports them.
const (
	BatchPending   = string(genai.JobStatePending)
	BatchRunning   = string(genai.JobStateRunning)
	BatchSucceeded = string(genai.JobStateSucceeded)
	BatchFailed    = string(genai.JobStateFailed)
	BatchCancelled = string(genai.JobStateCancelled)
	BatchExpired   = string(genai.JobStateExpired)
)

// BatchJob is a Gemini batch job: its name (batches/{id}), the display name it was created with,
// its state and, once it succeeded, one result per request.
type BatchJob struct {
	Name, DisplayName, State string
	Results                  []BatchResult
}

// Done reports whether the job is in a terminal state.
func (j BatchJob) Done() bool {
	switch j.State {
	case BatchSucceeded, BatchFailed, BatchCancelled, BatchExpired:
		return true
	}
	return false
}

// BatchResult is one request's outcome: its key (the request's TaskID), what it spent, at the
// batch price, and its answer, or the request's classified error.
type BatchResult struct {
	Key    string
	Result Result
	Err    error
}

// ErrBatchNotFound means no batch job has the name or display name asked for.
var ErrBatchNotFound = errors.New("gemini: batch job not found")

// ErrBatchTooLarge means Gemini refused a batch create for the size of its inlined requests
// (20 MB at most): the same requests in smaller jobs are accepted.
var ErrBatchTooLarge = errors.New("gemini: batch job too large")

// tooLarge reports whether err is Gemini's refusal of a request body for its size: 413, or 400
// INVALID_ARGUMENT "Request payload size exceeds the limit: N bytes." — the message is the only
// thing that tells this 400 from any other.
func tooLarge(err error) bool {
	var apiErr genai.APIError
	return errors.As(err, &apiErr) && (apiErr.Code == http.StatusRequestEntityTooLarge ||
		apiErr.Code == http.StatusBadRequest && strings.Contains(apiErr.Message, "payload size exceeds the limit"))
}

// BatchMaxSpend is the most req can spend as one request of a batch job of model: its estimated
// prompt and largest output at model's batch price, and no more than req's max_cost_usd.
func (p Pricing) BatchMaxSpend(req Request, model string) float64 {
	u := task.Usage{PromptTokens: promptTokens(req), OutputTokens: p.maxOutput(req.Config), AudioTokens: audioTokens(req)}
	worst := p.price(model).Bill(u, TierBatch)
	if req.MaxCostUSD > 0 {
		worst = min(worst, req.MaxCostUSD)
	}
	return worst
}

// BatchMaxSpend is Pricing.BatchMaxSpend under the client's configuration.
func (c *Client) BatchMaxSpend(req Request, model string) float64 {
	return c.cfg.BatchMaxSpend(req, model)
}

// BatchSize is about what req adds to the body of a batch create: its inlined request as JSON.
// Jobs are capped in bytes by it, well under Gemini's limit, as the wire form differs a little.
func (c *Client) BatchSize(req Request) int {
	b, err := json.Marshal(c.inlined(req))
	if err != nil {
		return 0 // an inlined request of strings and numbers always marshals
	}
	return len(b)
}

// inlined is req as one inlined request of a batch job, keyed by its task id.
func (c *Client) inlined(r Request) *genai.InlinedRequest {
	return &genai.InlinedRequest{
		Contents: contents(r),
		Metadata: map[string]string{BatchKey: r.TaskID},
		Config:   c.genaiConfig(r, r.Config),
	}
}

// CreateBatch submits reqs (one model, each keyed by its TaskID) as one batch job named
// displayName. The Batch API does not deduplicate: a repeated call makes a second job, so a caller
// records displayName before calling and finds the job again with FindBatch after a crash. A job
// refused for its size is ErrBatchTooLarge.
func (c *Client) CreateBatch(ctx context.Context, model, displayName string, reqs []Request) (BatchJob, error) {
	src := &genai.BatchJobSource{}
	for _, r := range reqs {
		src.InlinedRequests = append(src.InlinedRequests, c.inlined(r))
	}
	job, err := c.batches.Create(ctx, model, src, &genai.CreateBatchJobConfig{DisplayName: displayName})
	if tooLarge(err) {
		return BatchJob{}, fmt.Errorf("create batch %s of %d requests: %w: %w", displayName, len(reqs), ErrBatchTooLarge, err)
	}
	if err != nil {
		return BatchJob{}, fmt.Errorf("create batch %s: %w", displayName, err)
	}
	return c.batchJob(job, nil), nil
}

// GetBatch reads a job; a succeeded one comes with its results, validated and priced at the
// batch rate with the requests of reqs (by TaskID): an output its request's validator refuses is
// a Quality error. A job Gemini no longer knows is ErrBatchNotFound.
func (c *Client) GetBatch(ctx context.Context, name string, reqs map[string]Request) (BatchJob, error) {
	job, err := c.batches.Get(ctx, name, nil)
	if apiErr := (genai.APIError{}); errors.As(err, &apiErr) && apiErr.Code == http.StatusNotFound {
		return BatchJob{}, fmt.Errorf("get batch %s: %w", name, ErrBatchNotFound)
	}
	if err != nil {
		return BatchJob{}, fmt.Errorf("get batch %s: %w", name, err)
	}
	return c.batchJob(job, reqs), nil
}

// FindBatch finds the newest job created with displayName, listing every job: how a caller that
// crashed between CreateBatch and recording its answer finds the job instead of creating a
// second one. No such job is ErrBatchNotFound.
func (c *Client) FindBatch(ctx context.Context, displayName string) (BatchJob, error) {
	for job, err := range c.batches.All(ctx) {
		if err != nil {
			return BatchJob{}, fmt.Errorf("list batches: %w", err)
		}
		if job.DisplayName == displayName {
			return c.batchJob(job, nil), nil
		}
	}
	return BatchJob{}, fmt.Errorf("batch %s: %w", displayName, ErrBatchNotFound)
}

// CancelBatch asks Gemini to cancel a job that is not done; it ends cancelled, with no results.
func (c *Client) CancelBatch(ctx context.Context, name string) error {
	if err := c.batches.Cancel(ctx, name, nil); err != nil {
		return fmt.Errorf("cancel batch %s: %w", name, err)
	}
	return nil
}

// DeleteBatch deletes a job with its requests and results. A job Gemini no longer knows is
// ErrBatchNotFound.
func (c *Client) DeleteBatch(ctx context.Context, name string) error {
	_, err := c.batches.Delete(ctx, name, nil)
	if apiErr := (genai.APIError{}); errors.As(err, &apiErr) && apiErr.Code == http.StatusNotFound {
		return fmt.Errorf("delete batch %s: %w", name, ErrBatchNotFound)
	}
	if err != nil {
		return fmt.Errorf("delete batch %s: %w", name, err)
	}
	return nil
}

func (c *Client) batchJob(job *genai.BatchJob, reqs map[string]Request) BatchJob {
	out := BatchJob{Name: job.Name, DisplayName: job.DisplayName, State: string(job.State)}
	if job.State != genai.JobStateSucceeded || job.Dest == nil {
		return out
	}
	model := strings.TrimPrefix(job.Model, "models/")
	for _, r := range job.Dest.InlinedResponses {
		out.Results = append(out.Results, c.batchResult(model, r, reqs))
	}
	return out
}

// batchResult turns one inlined response into what it spent and produced, or its error.
func (c *Client) batchResult(model string, r *genai.InlinedResponse, reqs map[string]Request) BatchResult {
	br := BatchResult{Key: r.Metadata[BatchKey]}
	if r.Error != nil {
		code := 0
		if r.Error.Code != nil {
			code = int(*r.Error.Code)
		}
		class := Permanent
		if code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500 || code == 0 {
			class = Transient
		}
		br.Err = &Error{Class: class, Code: code, Model: model, Err: errors.New(r.Error.Message)}
		return br
	}
	if r.Response == nil {
		br.Err = &Error{Class: Transient, Model: model, Err: errors.New("the batch job returned neither a response nor an error")}
		return br
	}
	u := usageOf(r.Response)
	br.Result = Result{Model: model, Usage: u, Calls: 1, Tier: TierBatch, CostUSD: c.cfg.price(model).Bill(u, TierBatch)}
	if err := blocked(r.Response); err != nil {
		br.Err = &Error{Class: Permanent, Code: http.StatusOK, Model: model, Err: err}
		return br
	}
	text := r.Response.Text()
	if req, ok := reqs[br.Key]; ok && req.Validate != nil {
		if err := req.Validate(text); err != nil {
			br.Err = &Error{Class: Quality, Code: http.StatusOK, Model: model, Err: err}
			return br
		}
	}
	br.Result.Text = text
	return br
}
