package publisher

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"go.opentelemetry.io/otel/trace"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// List page sizes.
const (
	defaultPageSize = 20
	maxPageSize     = 100
	batchWorkers    = 8
)

// submitted is the outcome of one accepted submission.
type submitted struct {
	t        *protocol.Task
	replayed bool
}

func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request, tenant string) error {
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	if err := s.take(r.Context(), tenant); err != nil {
		return err
	}
	var req task.Request
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	res, err := s.submit(r.Context(), tenant, key, &req)
	if err != nil {
		return err
	}
	resp := s.submitResponse(r, res.t)
	w.Header().Set("Location", resp.StatusURL)
	code := http.StatusAccepted
	if res.replayed {
		w.Header().Set(task.HeaderReplayed, "true")
		code = http.StatusOK
	}
	httpapi.JSON(w, code, "application/json", resp)
	return nil
}

// take takes one submission token of tenant (limiters.take, its read of the tenant's limits
// bounded).
func (s *Server) take(ctx context.Context, tenant string) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.limits.take(ctx, tenant, s.now())
}

// submit validates req and creates its task, then nudges it. With an idempotency key, the task
// id is derived from tenant and key, so Firestore's Create is the dedup. Its store calls are
// bounded together: a write that timed out may still land, and a retry under the same key finds
// it.
func (s *Server) submit(ctx context.Context, tenant, key string, req *task.Request) (submitted, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	now := s.now()
	normalize(req)
	id := randomID()
	if key != "" {
		id = derivedID(tenant, key)
	}
	v := validator{families: s.families, checkCallback: s.checkURL, now: now, maxFiles: s.cfg.MaxFiles}
	variant, err := v.validate(req)
	var files []protocol.File
	if err == nil {
		files, err = s.resolveFiles(ctx, tenant, req, variant)
	}
	hash, herr := requestHash(req, files)
	if herr != nil {
		return submitted{}, herr
	}
	if err != nil && key != "" {
		// A retry of an accepted request may no longer validate (run_before has passed, the
		// policy changed): the key still names its task.
		if res, rerr := s.replay(ctx, tenant, id, hash); rerr == nil {
			return res, nil
		}
	}
	if err != nil {
		return submitted{}, err
	}
	t := s.newTask(id, tenant, key, hash, req, variant, now)
	if start := startOf(req, now); start != nil {
		t.Schedule(*start)
	} else {
		s.slots.SubmitWaiting(ctx, t, s.cfg.TenantWaitMax, now)
	}
	t.Files = files
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		t.TraceID = sc.TraceID().String()
	}
	err = s.st.CreateTask(ctx, t)
	if errors.Is(err, store.ErrExists) && key != "" {
		return s.replay(ctx, tenant, id, hash)
	}
	if err != nil {
		return submitted{}, err
	}
	s.metrics.TaskState(ctx, t.Family, t.State)
	if t.State == task.StateQueued {
		s.nudge(ctx, t) // a scheduled task is nudged by the sweeper when it is due
	}
	return submitted{t: t}, nil
}

// newTask is the queued task of a valid request, due for the sweeper's nudge after the grace.
func (s *Server) newTask(id, tenant, key, hash string, req *task.Request, variant *prompts.Variant, now time.Time) *protocol.Task {
	grace := now.Add(s.cfg.NudgeGrace)
	return &protocol.Task{
		ID: id, Tenant: tenant, Family: req.Family, Variant: req.Variant, Input: req.Input,
		SubjectKey: req.SubjectKey, GenConfig: req.Config, CallbackURL: req.CallbackURL, Labels: req.Labels,
		Cache: req.Cache, RunBefore: req.RunBefore, MaxCostUSD: req.MaxCostUSD, Stream: req.Stream,
		IdempotencyKey: key, RequestHash: hash, State: task.StateQueued,
		Delivery:      protocol.Delivery{State: task.DeliveryNone},
		PromptVersion: variant.Version, ModelChain: variant.Models, Mode: effectiveMode(req.Mode, variant.Mode),
		Priority: priorityOf(req), CreatedAt: now, NudgeAt: &grace,
	}
}

// priorityOf is the request's priority, else task.DefaultPriority.
func priorityOf(req *task.Request) int {
	if req.Priority == nil {
		return task.DefaultPriority
	}
	return *req.Priority
}

// effectiveMode is the request's mode, else its family's default; standard is stored as "".
func effectiveMode(asked, family task.Mode) task.Mode {
	m := asked
	if m == "" {
		m = family
	}
	if m == task.ModeStandard {
		return ""
	}
	return m
}

// replay answers a repeated Idempotency-Key: the same request gets the same task.
func (s *Server) replay(ctx context.Context, tenant, id, hash string) (submitted, error) {
	t, err := s.st.GetTask(ctx, id)
	if err != nil {
		return submitted{}, err
	}
	if t.Tenant != tenant || t.RequestHash != hash {
		return submitted{}, httpapi.Problem(http.StatusUnprocessableEntity, probIdemMismatch,
			"this Idempotency-Key was used with a different request", task.FieldError{Field: task.HeaderIdempotencyKey, Detail: "already used with a different request"})
	}
	return submitted{t: t, replayed: true}, nil
}

// nudge publishes the task's nudge on gemini-tasks. A failure is only logged: the task is
// already due at now+grace, so the sweeper nudges it.
func (s *Server) nudge(ctx context.Context, t *protocol.Task) {
	ctx, cancel := context.WithTimeout(obs.WithTask(context.WithoutCancel(ctx), t.ID), s.cfg.PublishTimeout)
	defer cancel()
	if _, err := s.pub.Publish(ctx, bus.TopicTasks, nil, nudgeAttrs(t)); err != nil {
		s.log.WarnContext(ctx, "nudge not published; the sweeper will nudge the task", "task_id", t.ID, "error", err)
	}
}

// nudgeAttrs are the attributes of t's nudge on gemini-tasks.
func nudgeAttrs(t *protocol.Task) map[string]string {
	return map[string]string{task.AttrTaskID: t.ID, task.AttrTenant: t.Tenant, task.AttrFamily: t.Family, task.AttrVariant: t.Variant}
}

func (s *Server) submitResponse(r *http.Request, t *protocol.Task) task.SubmitResponse {
	return task.SubmitResponse{TaskID: t.ID, State: t.State, StatusURL: s.statusURL(r, t.ID)}
}

func (s *Server) statusURL(r *http.Request, id string) string {
	return s.baseURL(r) + "/v1/tasks/" + id
}

// baseURL is the API's public base: GENBOX_PUBLIC_URL, else the request's scheme and host.
func (s *Server) baseURL(r *http.Request) string {
	base := s.cfg.PublicURL
	if base == "" {
		scheme := "http"
		if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
			scheme = "https"
		}
		base = scheme + "://" + r.Host
	}
	return base
}

// requestHash is the SHA-256 of the normalized request's JSON (struct fields in order, map keys
// sorted), with the keys of the files it resolved to (their generations and checksums): the same
// request naming a new generation of an object is a different request.
func requestHash(req *task.Request, files []protocol.File) (string, error) {
	var v any = req
	if len(files) > 0 {
		keys := make([]string, len(files))
		for i, f := range files {
			keys[i] = f.Key()
		}
		v = []any{req, keys}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("hash request: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// randomID is a task id of 128 random bits: not time-ordered, so writes spread over the keyspace.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// derivedID is the task id of an idempotency key: another tenant's key can never name it.
func derivedID(tenant, key string) string {
	sum := sha256.Sum256([]byte("genbox/idempotency\x00" + tenant + "\x00" + key))
	return hex.EncodeToString(sum[:16])
}

// batchBody is POST /v1/tasks:batch as read: items are decoded one by one so one bad item does
// not refuse the others.
type batchBody struct {
	Tasks []json.RawMessage `json:"tasks"`
}

func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request, tenant string) error {
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	var body batchBody
	if err := s.decodeBody(w, r, &body); err != nil {
		return err
	}
	if len(body.Tasks) == 0 || len(body.Tasks) > task.MaxBatch {
		return fieldProblem("tasks", "must hold 1 to %d requests", task.MaxBatch)
	}
	results := make([]task.BatchResult, len(body.Tasks))
	sem := make(chan struct{}, batchWorkers)
	var wg sync.WaitGroup
	for i, raw := range body.Tasks {
		results[i].Index = i
		// Tokens are taken in order, so a batch over the rate keeps its first items.
		err := s.take(r.Context(), tenant)
		if err == nil {
			var req task.Request
			if err = decodeStrict(raw, &req); err == nil {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					itemKey := ""
					if key != "" {
						itemKey = key + "#" + strconv.Itoa(i)
					}
					res, err := s.submit(r.Context(), tenant, itemKey, &req)
					s.batchResult(r, &results[i], res, err)
				})
				continue
			}
		}
		s.batchResult(r, &results[i], submitted{}, err)
	}
	wg.Wait()
	httpapi.JSON(w, http.StatusOK, "application/json", task.BatchResponse{Results: results})
	return nil
}

func (s *Server) batchResult(r *http.Request, out *task.BatchResult, res submitted, err error) {
	if err != nil {
		p := problemFor(err)
		if p.Status >= 500 {
			s.log.ErrorContext(r.Context(), "batch item failed", "index", out.Index, "error", err)
		}
		out.Status, out.Problem = p.Status, p
		return
	}
	resp := s.submitResponse(r, res.t)
	out.Status, out.TaskID, out.State, out.StatusURL, out.Replayed = http.StatusAccepted, resp.TaskID, resp.State, resp.StatusURL, res.replayed
	if res.replayed {
		out.Status = http.StatusOK
	}
}

// own reads, with get, the document of tenant the request's path names; another tenant's
// document, like a malformed id, is not found.
func own[T any](s *Server, r *http.Request, tenant string, get func(context.Context, string) (T, error), owner func(T) string) (T, error) {
	var none T
	id, err := pathID(r, "id")
	if err != nil {
		return none, err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	d, err := get(ctx, id)
	if err != nil {
		return none, err
	}
	if owner(d) != tenant {
		return none, fmt.Errorf("%s: %w", id, store.ErrNotFound)
	}
	return d, nil
}

// ownTask reads the task of tenant the request's path names (own).
func (s *Server) ownTask(r *http.Request, tenant string) (*protocol.Task, error) {
	return own(s, r, tenant, s.st.GetTask, func(t *protocol.Task) string { return t.Tenant })
}

// pageSize reads a listing's limit parameter: 1 to maxPageSize, def when absent.
func pageSize(r *http.Request, def int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxPageSize {
		return 0, fieldProblem("limit", "must be an integer from 1 to %d", maxPageSize)
	}
	return n, nil
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request, tenant string) error {
	t, err := s.ownTask(r, tenant)
	if err != nil {
		return err
	}
	httpapi.JSON(w, http.StatusOK, "application/json", t.View())
	return nil
}

// pageToken is the opaque cursor of GET /v1/tasks: the last task of a page and the filter it
// was listed under.
type pageToken struct {
	CreatedAt time.Time  `json:"c"`
	ID        string     `json:"i"`
	State     task.State `json:"s,omitempty"`
}

func encodePageToken(c *store.Cursor, state task.State) string {
	if c == nil {
		return ""
	}
	b, _ := json.Marshal(pageToken{CreatedAt: c.CreatedAt, ID: c.ID, State: state})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s string, state task.State) (*store.Cursor, error) {
	if s == "" {
		return nil, nil
	}
	bad := fieldProblem("page_token", "is not a page token of this listing")
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	var pt pageToken
	if err := json.Unmarshal(b, &pt); err != nil || pt.ID == "" || pt.State != state {
		return nil, bad
	}
	return &store.Cursor{CreatedAt: pt.CreatedAt, ID: pt.ID}, nil
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request, tenant string) error {
	q := r.URL.Query()
	state := task.State(q.Get("state"))
	if state != "" && !state.Valid() {
		return fieldProblem("state", "must be one of %v", task.States)
	}
	limit, err := pageSize(r, defaultPageSize)
	if err != nil {
		return err
	}
	cur, err := decodePageToken(q.Get("page_token"), state)
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	tasks, next, err := s.st.ListTasks(ctx, tenant, state, limit, cur)
	if err != nil {
		return err
	}
	out := task.List{Tasks: make([]task.View, 0, len(tasks)), NextPageToken: encodePageToken(next, state)}
	for _, t := range tasks {
		out.Tasks = append(out.Tasks, t.View())
	}
	httpapi.JSON(w, http.StatusOK, "application/json", out)
	return nil
}

// conflict is a 409 saying why the task cannot move.
func conflict(t *protocol.Task, what string) error {
	return httpapi.Problem(http.StatusConflict, httpapi.TypeConflict, fmt.Sprintf("task %s is %s: %s", t.ID, t.State, what))
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request, tenant string) error {
	id, err := pathID(r, "id")
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	t, err := s.st.MutateTask(ctx, id, func(t *protocol.Task, now time.Time) error {
		if t.Tenant != tenant {
			return store.ErrNotFound
		}
		if t.State != task.StateScheduled && t.State != task.StateQueued && t.State != task.StateWaiting && !t.InBatchJob() {
			return conflict(t, "only a scheduled, queued or waiting task, or one running in a batch job, can be cancelled")
		}
		t.Finish(task.StateCancelled, now)
		if t.Delivery.State == task.DeliveryPending {
			grace := now.Add(s.cfg.NudgeGrace)
			t.NudgeAt = &grace // nudged below; the sweeper takes over if that is lost
		}
		return nil
	})
	if err != nil {
		return err
	}
	var e2e time.Duration
	if t.CompletedAt != nil {
		e2e = t.CompletedAt.Sub(t.CreatedAt)
	}
	s.metrics.TaskFinished(r.Context(), t.Family, t.State, e2e)
	if t.Delivery.State == task.DeliveryPending {
		s.nudgeDelivery(r.Context(), t, "cancel")
	}
	httpapi.JSON(w, http.StatusOK, "application/json", t.View())
	return nil
}

// nudgeDelivery publishes the results nudge of t's pending delivery, which the write of what
// (a cancel, an erase) started; if it is lost, the sweeper nudges after NudgeGrace.
func (s *Server) nudgeDelivery(ctx context.Context, t *protocol.Task, what string) {
	ctx, cancel := context.WithTimeout(obs.WithTask(context.WithoutCancel(ctx), t.ID), s.cfg.PublishTimeout)
	defer cancel()
	if _, err := s.pub.Publish(ctx, bus.TopicResults, nil, map[string]string{task.AttrTaskID: t.ID, task.AttrTenant: t.Tenant}); err != nil {
		s.log.WarnContext(ctx, what+" nudge not published; the sweeper will nudge the delivery", "task_id", t.ID, "error", err)
	}
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request, tenant string) error {
	id, err := pathID(r, "id")
	if err != nil {
		return err
	}
	// The open dead letter of a dead webhook delivery is discarded with the erase: it bills
	// nothing, and floods of them are not paged task by task. One of a dead generation is a
	// human's to decide: they may regenerate the task.
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	t, discarded, err := s.st.EraseTask(ctx, id, s.cfg.NudgeGrace, func(t *protocol.Task) error {
		switch {
		case t.Tenant != tenant:
			return store.ErrNotFound
		case !t.State.Finished():
			return conflict(t, "only a finished task can be deleted; cancel it first")
		case t.State == task.StateDead || t.GenerationDeadLetterOpen():
			return conflict(t, "its dead letter is open (a human may still regenerate it); discard it first")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if t.FileErase != nil && len(t.FileErase.Keys) > 0 {
		s.nudgeCopyErase(r.Context(), t)
	}
	if len(discarded) > 0 {
		s.log.InfoContext(r.Context(), "erase discarded the task's dead webhook delivery", "task_id", t.ID, "dead_letters", discarded)
		if t.Delivery.State == task.DeliveryPending {
			s.nudgeDelivery(r.Context(), t, "erase")
		}
	}
	// After the erase commits: a worker's cache or last good write that raced with it either
	// committed first (and is found here) or saw the erase and wrote nothing.
	ctx, cancelOutputs := s.bound(r.Context())
	defer cancelOutputs()
	if err := s.st.EraseOutputs(ctx, t.ID, t.Fingerprint); err != nil {
		return err
	}
	if err := s.eraseUploads(ctx, t); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
