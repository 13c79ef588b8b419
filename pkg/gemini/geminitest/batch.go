package geminitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Batch job states as the Gemini API names them; the genai SDK reports BATCH_STATE_X as
// JOB_STATE_X (genai.JobStateSucceeded for BatchSucceeded).
const (
	BatchPending   = "BATCH_STATE_PENDING"
	BatchRunning   = "BATCH_STATE_RUNNING"
	BatchSucceeded = "BATCH_STATE_SUCCEEDED"
	BatchFailed    = "BATCH_STATE_FAILED"
	BatchCancelled = "BATCH_STATE_CANCELLED"
	BatchExpired   = "BATCH_STATE_EXPIRED"
)

// BatchExpiry is how long a batch job may stay pending or running before it expires with no
// results, as Gemini's do.
const BatchExpiry = 48 * time.Hour

// BatchPlan is how a model's batch jobs run: Pending in BATCH_STATE_PENDING, then Running in
// BATCH_STATE_RUNNING, then their outcome. A job that would take longer than BatchExpiry
// expires at BatchExpiry. The zero plan succeeds at once.
type BatchPlan struct {
	Pending, Running time.Duration
	// Outcome is BatchSucceeded (or ""), BatchFailed or BatchExpired. A succeeded job runs every
	// request through the Responder (a Reply with a Code is that request's inlined error) and
	// bills each answered one at the batch tier; a failed or expired one answers and bills none.
	Outcome string
}

// SetBatchPlan sets how a model's batch jobs created from now on run.
func (f *Fake) SetBatchPlan(model string, p BatchPlan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plans[model] = p
}

// FailBatchesNext appends to a model's batch outcome schedule: each of its next batch jobs ends
// in the given state (BatchFailed, BatchExpired or BatchSucceeded) instead of its plan's, after
// the plan's pending and running times.
func (f *Fake) FailBatchesNext(model string, states ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batchScript[model] = append(f.batchScript[model], states...)
}

// FailBatchDeletesNext appends to the batch delete failure schedule: each of the next
// DELETE batches/{id} calls, of any job, answers the given HTTP code (500, 503, ...) and deletes
// nothing.
func (f *Fake) FailBatchDeletesNext(codes ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleteFailures = append(f.deleteFailures, codes...)
}

// SetBatchByteLimit makes the fake refuse a batch create whose body is over limit bytes, as
// Gemini refuses one over its 20 MB (400 INVALID_ARGUMENT, "Request payload size exceeds the
// limit"); limit <= 0 restores that default.
func (f *Fake) SetBatchByteLimit(limit int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if limit <= 0 {
		limit = maxBody
	}
	f.batchLimit = limit
}

// batchRequest is one inlined request of a job.
type batchRequest struct {
	req      Request
	metadata map[string]any
}

// batchJob is one batches/{id} resource; the Fake's mutex guards it.
type batchJob struct {
	id, model, displayName string
	state                  string
	outcome                string
	created, updated       time.Time
	ended                  *time.Time
	requests               []batchRequest
	bytes                  int // the create call's body
	responses              []wireInlinedResponse
	failed                 int
	finishing, deleted     bool
	timers                 []*time.Timer
}

func (b *batchJob) name() string { return "batches/" + b.id }

func (b *batchJob) done() bool {
	switch b.state {
	case BatchSucceeded, BatchFailed, BatchCancelled, BatchExpired:
		return true
	}
	return false
}

func (b *batchJob) record() BatchRecord {
	return BatchRecord{Name: b.name(), DisplayName: b.displayName, Model: b.model, State: b.state, Requests: len(b.requests), Failed: b.failed, Deleted: b.deleted, Bytes: b.bytes}
}

// end moves the job into a terminal state at now and stops its timers.
func (b *batchJob) end(state string, now time.Time) {
	b.state, b.updated, b.ended = state, now, &now
	for _, t := range b.timers {
		t.Stop()
	}
}

// The batch job as the API sends it: a long-running operation whose metadata is the batch.
type wireBatchOperation struct {
	Name     string           `json:"name"`
	Metadata wireBatch        `json:"metadata"`
	Done     bool             `json:"done,omitempty"`
	Error    *googleErrorBody `json:"error,omitempty"`
}

type wireBatch struct {
	Type        string           `json:"@type"`
	Name        string           `json:"name"`
	Model       string           `json:"model"`
	DisplayName string           `json:"displayName,omitempty"`
	CreateTime  string           `json:"createTime"`
	UpdateTime  string           `json:"updateTime"`
	EndTime     string           `json:"endTime,omitempty"`
	State       string           `json:"state"`
	BatchStats  wireBatchStats   `json:"batchStats"`
	Output      *wireBatchOutput `json:"output,omitempty"`
}

// wireBatchStats counts a job's requests; its int64 fields are JSON strings, as the API sends
// every int64.
type wireBatchStats struct {
	RequestCount           int64 `json:"requestCount,string"`
	SuccessfulRequestCount int64 `json:"successfulRequestCount,omitempty,string"`
	FailedRequestCount     int64 `json:"failedRequestCount,omitempty,string"`
	PendingRequestCount    int64 `json:"pendingRequestCount,omitempty,string"`
}

type wireBatchOutput struct {
	InlinedResponses wireInlinedResponses `json:"inlinedResponses"`
}

type wireInlinedResponses struct {
	InlinedResponses []wireInlinedResponse `json:"inlinedResponses"`
}

// wireInlinedResponse is one request's outcome, in request order, with the request's metadata
// echoed so that a client finds its own key.
type wireInlinedResponse struct {
	Response *wireResponse  `json:"response,omitempty"`
	Error    *wireJobError  `json:"error,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

type wireJobError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// wireBatchCreate is the body of models/{model}:batchGenerateContent.
type wireBatchCreate struct {
	Batch struct {
		DisplayName string `json:"displayName"`
		InputConfig struct {
			FileName string `json:"fileName"`
			Requests *struct {
				Requests []struct {
					Request  json.RawMessage `json:"request"`
					Metadata map[string]any  `json:"metadata"`
				} `json:"requests"`
			} `json:"requests"`
		} `json:"inputConfig"`
	} `json:"batch"`
}

func (b *batchJob) wire() wireBatchOperation {
	w := wireBatch{
		Type: "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
		Name: b.name(), Model: "models/" + b.model, DisplayName: b.displayName,
		CreateTime: timestamp(b.created), UpdateTime: timestamp(b.updated), State: b.state,
		BatchStats: wireBatchStats{RequestCount: int64(len(b.requests))},
	}
	if b.ended != nil {
		w.EndTime = timestamp(*b.ended)
	}
	op := wireBatchOperation{Name: b.name(), Metadata: w, Done: b.done()}
	switch b.state {
	case BatchSucceeded:
		op.Metadata.BatchStats.SuccessfulRequestCount = int64(len(b.requests) - b.failed)
		op.Metadata.BatchStats.FailedRequestCount = int64(b.failed)
		op.Metadata.Output = &wireBatchOutput{InlinedResponses: wireInlinedResponses{InlinedResponses: b.responses}}
	case BatchFailed:
		op.Error = &googleErrorBody{Code: http.StatusInternalServerError, Message: "The batch job failed.", Status: statusOf(http.StatusInternalServerError)}
	case BatchPending, BatchRunning:
		op.Metadata.BatchStats.PendingRequestCount = int64(len(b.requests))
	}
	return op
}

func (f *Fake) routeBatches() {
	f.mux.HandleFunc("GET /{version}/batches", f.authorized(f.listBatches))
	f.mux.HandleFunc("GET /{version}/batches/{id}", f.authorized(f.getBatch))
	f.mux.HandleFunc("POST /{version}/batches/{call}", f.authorized(f.cancelBatch))
	f.mux.HandleFunc("DELETE /{version}/batches/{id}", f.authorized(f.deleteBatch))
}

// createBatch serves models/{model}:batchGenerateContent with inlined requests.
func (f *Fake) createBatch(w http.ResponseWriter, model string, body []byte) {
	f.mu.Lock()
	limit := f.batchLimit
	if len(body) > limit {
		f.batchesRefused++
	}
	f.mu.Unlock()
	if len(body) > limit {
		f.writeError(w, payloadTooLarge(limit))
		return
	}
	var in wireBatchCreate
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&in); err != nil {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "Invalid JSON payload received. " + err.Error()})
		return
	}
	ic := in.Batch.InputConfig
	if ic.FileName != "" {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "The fake serves batch jobs of inlined requests only."})
		return
	}
	if ic.Requests == nil || len(ic.Requests.Requests) == 0 {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "* BatchGenerateContentRequest.batch.input_config: requests must not be empty"})
		return
	}
	now := time.Now()
	b := &batchJob{model: model, displayName: in.Batch.DisplayName, state: BatchPending, created: now, updated: now, bytes: len(body)}
	for i, r := range ic.Requests.Requests {
		req, err := decodeRequest(model, methodBatch, r.Request)
		if err != nil {
			fail := badRequest(err)
			fail.message = fmt.Sprintf("* BatchGenerateContentRequest.batch.input_config.requests.requests[%d].request: %s", i, fail.message)
			f.writeError(w, fail)
			return
		}
		if fail := f.attachFiles(&req, now); fail != nil {
			fail.message = fmt.Sprintf("* BatchGenerateContentRequest.batch.input_config.requests.requests[%d].request: %s", i, fail.message)
			f.writeError(w, *fail)
			return
		}
		req.Tier = TierBatch
		b.requests = append(b.requests, batchRequest{req: req, metadata: r.Metadata})
	}
	f.mu.Lock()
	f.ids++
	b.id = fmt.Sprintf("fake%06d", f.ids)
	plan := f.plans[model]
	b.outcome = plan.Outcome
	if q := f.batchScript[model]; len(q) > 0 {
		b.outcome, f.batchScript[model] = q[0], q[1:]
	}
	if b.outcome == "" {
		b.outcome = BatchSucceeded
	}
	for i := range b.requests {
		b.requests[i].req.Batch = b.name()
	}
	f.batches = append(f.batches, b)
	f.schedule(b, plan)
	out := b.wire()
	f.mu.Unlock()
	f.log.Info("fake gemini batch created", "name", b.name(), "display_name", b.displayName, "model", model, "requests", len(b.requests), "outcome", b.outcome)
	writeJSON(w, http.StatusOK, out)
}

// schedule starts b's timers, under the lock: running after the plan's pending time, then its
// outcome after the running time, or expiry at BatchExpiry, whichever comes first.
func (f *Fake) schedule(b *batchJob, plan BatchPlan) {
	end := plan.Pending + plan.Running
	if end >= BatchExpiry {
		b.outcome, end = BatchExpired, BatchExpiry
	}
	if plan.Pending < end {
		b.timers = append(b.timers, time.AfterFunc(plan.Pending, func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if b.state == BatchPending {
				b.state, b.updated = BatchRunning, time.Now()
			}
		}))
	}
	b.timers = append(b.timers, time.AfterFunc(end, func() { f.finishBatch(b) }))
}

// finishBatch ends a job in its outcome. A succeeded job's requests are generated now, each
// through the Responder, and each answered one is billed at the batch tier.
func (f *Fake) finishBatch(b *batchJob) {
	f.mu.Lock()
	if b.done() || b.deleted {
		f.mu.Unlock()
		return
	}
	if b.outcome != BatchSucceeded {
		b.end(b.outcome, time.Now())
		f.mu.Unlock()
		return
	}
	b.finishing = true
	responder, reqs := f.responder, b.requests
	f.mu.Unlock()
	out := make([]wireInlinedResponse, len(reqs))
	failed := 0
	for i, br := range reqs {
		out[i].Metadata = br.metadata
		req, reply, fail := f.generateBatched(br.req, responder)
		if fail != nil {
			failed++
			out[i].Error = &wireJobError{Code: fail.code, Message: fail.body().Error.Message}
			continue
		}
		usage := usageOf(req, reply)
		out[i].Response = &wireResponse{
			Candidates:    []wireCandidate{{Content: wireContent{Role: "model", Parts: []wirePart{{Text: reply.Text}}}, FinishReason: reply.FinishReason}},
			UsageMetadata: wireUsageOf(usage, TierBatch),
			ModelVersion:  req.Model,
			ResponseID:    newHashStream(req).id() + fmt.Sprintf("-%d", req.Call),
		}
		if reply.BlockReason != "" {
			out[i].Response.Candidates = nil
			out[i].Response.PromptFeedback = &wirePromptFeedback{BlockReason: reply.BlockReason}
		}
		f.bill(Bill{Request: req, Usage: usage, Tier: TierBatch, Started: b.created})
		f.mu.Lock()
		f.ledger.tally(req.Model).Batched++
		f.mu.Unlock()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b.responses, b.failed, b.finishing = out, failed, false
	b.end(BatchSucceeded, time.Now())
}

// generateBatched runs one request of a job: its cached prefix, its numbering and implicit
// caching, then the Responder. A failure is the request's inlined error, not billed.
func (f *Fake) generateBatched(req Request, responder Responder) (Request, Reply, *apiFailure) {
	now := time.Now()
	fail := f.prefix(&req, now)
	f.mu.Lock()
	req.Call = f.calls
	f.calls++
	t := f.ledger.tally(req.Model)
	t.Calls++
	if fail != nil {
		t.Failed++
		f.mu.Unlock()
		return req, Reply{}, fail
	}
	f.implicitHit(&req, now)
	f.mu.Unlock()
	reply := responder(req)
	if reply.Code != 0 {
		f.mu.Lock()
		t.Failed++
		f.mu.Unlock()
		return req, reply, &apiFailure{code: reply.Code, message: reply.Message, model: req.Model}
	}
	return req, reply.finalize(), nil
}

// lookupBatch returns the job of id under the lock.
func (f *Fake) lookupBatch(id string) (*batchJob, *apiFailure) {
	for _, b := range f.batches {
		if b.id == id && !b.deleted {
			return b, nil
		}
	}
	return nil, &apiFailure{code: http.StatusNotFound, message: "Requested entity was not found."}
}

func (f *Fake) getBatch(w http.ResponseWriter, r *http.Request) {
	f.answer(w, func() (any, *apiFailure) {
		b, fail := f.lookupBatch(r.PathValue("id"))
		if fail != nil {
			return nil, fail
		}
		return b.wire(), nil
	})
}

// listBatches lists the jobs, newest first.
func (f *Fake) listBatches(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	var all []wireBatchOperation
	for _, b := range slices.Backward(f.batches) {
		if !b.deleted {
			all = append(all, b.wire())
		}
	}
	f.mu.Unlock()
	page, next, fail := paginate(all, r.URL.Query())
	if fail != nil {
		f.writeError(w, *fail)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Operations    []wireBatchOperation `json:"operations,omitempty"`
		NextPageToken string               `json:"nextPageToken,omitempty"`
	}{page, next})
}

// cancelBatch serves batches/{id}:cancel: a job not yet done ends cancelled, with no results
// and nothing billed.
func (f *Fake) cancelBatch(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutSuffix(r.PathValue("call"), ":cancel")
	if !ok {
		f.writeError(w, apiFailure{code: http.StatusNotFound, message: "The requested URL " + r.URL.Path + " was not found on this server."})
		return
	}
	f.answer(w, func() (any, *apiFailure) {
		b, fail := f.lookupBatch(id)
		switch {
		case fail != nil:
			return nil, fail
		case b.done() || b.finishing:
			return nil, &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("Batch %s is %s and can no longer be cancelled.", b.name(), b.state)}
		}
		b.end(BatchCancelled, time.Now())
		return struct{}{}, nil
	})
}

// deleteBatch serves DELETE batches/{id}: the job is gone; one not yet done ends unbilled. A
// scheduled failure (FailBatchDeletesNext) answers first.
func (f *Fake) deleteBatch(w http.ResponseWriter, r *http.Request) {
	f.answer(w, func() (any, *apiFailure) {
		if len(f.deleteFailures) > 0 {
			code := f.deleteFailures[0]
			f.deleteFailures = f.deleteFailures[1:]
			return nil, &apiFailure{code: code, message: "The service is currently unavailable."}
		}
		b, fail := f.lookupBatch(r.PathValue("id"))
		if fail != nil {
			return nil, fail
		}
		if !b.done() && !b.finishing {
			b.end(BatchCancelled, time.Now())
		}
		b.deleted = true
		return struct{}{}, nil
	})
}

// stopBatches stops every job's timers: the fake is closing.
func (f *Fake) stopBatches() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.batches {
		for _, t := range b.timers {
			t.Stop()
		}
	}
}
