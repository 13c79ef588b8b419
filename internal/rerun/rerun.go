// Package rerun owns bulk re-runs (POST /v1/tasks:rerun): which of a tenant's tasks a filter
// selects, what one more generation of them costs, the reruns/{id} document that records a
// re-run, and the pacer that starts the new replays a page at a time behind a cursor, so that a
// re-run resumes after a crash and starts each task once.
package rerun

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Catalog renders a task's prompt from its family and variant (prompts.Registry): a re-run
// runs under the variant's current version, and prices a task no model answered from it.
type Catalog interface {
	Render(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error)
}

var _ Catalog = (*prompts.Registry)(nil)

// Runnable lists the states a re-run replays: the ends a task reached by running. A cancelled
// task never ran, and one still queued, running or waiting is running already.
var Runnable = []task.State{task.StateSucceeded, task.StateFailed, task.StateDead, task.StateDiscarded}

// MaxLabels bounds a filter's labels.
const MaxLabels = 16

// FieldError refuses one field of a re-run request.
type FieldError struct {
	Field, Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// ErrIDReused means a re-run id (or Idempotency-Key) already names a re-run of another filter.
var ErrIDReused = errors.New("rerun: this rerun id was used with a different filter")

// Validate checks f, naming the field it refuses.
func Validate(f task.RerunFilter) error {
	switch {
	case f.State != "" && !slices.Contains(Runnable, f.State):
		return &FieldError{"filter.state", fmt.Sprintf("must be one of %v (a re-run replays finished tasks)", Runnable)}
	case f.CreatedAfter != nil && f.CreatedBefore != nil && !f.CreatedAfter.Before(*f.CreatedBefore):
		return &FieldError{"filter.created_after", "must be before filter.created_before"}
	case len(f.Labels) > MaxLabels:
		return &FieldError{"filter.labels", fmt.Sprintf("at most %d", MaxLabels)}
	}
	return nil
}

// Matches reports whether t matches f. The tenant, the family and the creation bounds are
// matched by the query that found t (store.EachRerunCandidate, store.RerunPage).
func Matches(f task.RerunFilter, t *protocol.Task) bool {
	if f.State != "" && t.State != f.State || f.Family != "" && t.Family != f.Family {
		return false
	}
	if f.Variant != "" && variantName(t.Variant) != variantName(f.Variant) {
		return false
	}
	if f.PromptVersion != "" && t.PromptVersion != f.PromptVersion {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := t.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func variantName(v string) string {
	if v == "" {
		return prompts.DefaultVariant
	}
	return v
}

// Blocked says why a matching task cannot be re-run now, or "" when it can: it is running
// already (or was cancelled), its content was erased, or a dead letter of it awaits an
// operator, whose decision it is.
func Blocked(t *protocol.Task) string {
	switch {
	case !slices.Contains(Runnable, t.State):
		return "the task is " + string(t.State)
	case t.ErasedAt != nil:
		return "the task was erased"
	case len(t.OpenDeadLetters) > 0:
		return "a dead letter of the task awaits an operator"
	}
	return ""
}

// Estimator prices one more generation of a task with the worker's price table (gemini.Pricing).
type Estimator struct {
	Pricing gemini.Pricing
	Prompts Catalog
}

// Recorded prices one more generation of t from its recorded token counts, at today's rates for
// the model and tier that served it: the same prompt gets about the same answer again, so this
// is what the new replay bills. ok is false for a task no model answered.
func (e Estimator) Recorded(t *protocol.Task) (usd float64, ok bool) {
	if t.Model == "" || t.Usage.PromptTokens+t.Usage.OutputTokens == 0 {
		return 0, false
	}
	return e.Pricing.Price(t.Model).Bill(t.Usage, tier(t.Mode)), true
}

// Cost prices one more generation of t, rendered as r: Recorded, else — for a task no model
// answered — the worst case of its rendered prompt, as the Regenerate button prices a dead
// letter (gemini.Pricing.Estimate of protocol.Task.Request).
func (e Estimator) Cost(t *protocol.Task, r *prompts.Rendered) float64 {
	if usd, ok := e.Recorded(t); ok {
		return usd
	}
	_, usd := e.Pricing.Estimate(t.Request(r))
	return usd
}

// tier is the service tier a task of mode is billed at.
func tier(m task.Mode) gemini.Tier {
	switch m {
	case task.ModeFlex:
		return gemini.TierFlex
	case task.ModeBatch:
		return gemini.TierBatch
	}
	return gemini.TierStandard
}

// Planner answers dry runs and creates re-runs: the publisher's POST /v1/tasks:rerun and the
// operators' console share it, so both count and price alike.
type Planner struct {
	Store     *store.Store
	Estimator Estimator
}

// Estimate counts the tasks of tenant that f matches, created before until, that can be re-run,
// and prices one more generation of each.
func (p Planner) Estimate(ctx context.Context, tenant string, f task.RerunFilter, until time.Time) (count int, usd float64, err error) {
	err = p.Store.EachRerunCandidate(ctx, tenant, f, until, func(t *protocol.Task) error {
		if !Matches(f, t) || Blocked(t) != "" {
			return nil
		}
		if _, err := p.Estimator.Prompts.Render(t.Family, t.Variant, "", t.GenConfig); err != nil {
			return nil // a retired variant: the pacer skips it too
		}
		count++
		if cost, ok := p.Estimator.Recorded(t); ok {
			usd += cost
			return nil
		}
		// No model answered it: its prompt, input and all, is priced at the worst case.
		full, err := p.Store.GetTask(ctx, t.ID)
		if err != nil {
			return err
		}
		r, err := p.Estimator.Prompts.Render(full.Family, full.Variant, full.Input, full.GenConfig)
		if err != nil {
			return nil
		}
		usd += p.Estimator.Cost(full, r)
		return nil
	})
	return count, usd, err
}

// DryRun answers a dry run: the count and the estimate, nothing started.
func (p Planner) DryRun(ctx context.Context, tenant string, f task.RerunFilter) (task.Rerun, error) {
	if err := Validate(f); err != nil {
		return task.Rerun{}, err
	}
	n, usd, err := p.Estimate(ctx, tenant, f, p.Store.Clock())
	if err != nil {
		return task.Rerun{}, err
	}
	return task.Rerun{DryRun: true, Filter: f, Count: n, EstimatedCostUSD: usd}, nil
}

// Start creates the re-run of tenant named rerunID (a random id when empty) over f, asked for
// by by, with its count and estimate, for the pacer to run. A rerunID that already names a
// re-run of the same filter returns that re-run (replayed); of another filter, ErrIDReused.
func (p Planner) Start(ctx context.Context, tenant, rerunID, by string, f task.RerunFilter) (r *store.Rerun, replayed bool, err error) {
	if err := Validate(f); err != nil {
		return nil, false, err
	}
	hash, err := filterHash(f)
	if err != nil {
		return nil, false, err
	}
	if rerunID == "" {
		rerunID = randomID()
	}
	id := DocID(tenant, rerunID)
	if r, err := p.existing(ctx, tenant, id, hash); !errors.Is(err, store.ErrNotFound) {
		return r, err == nil, err
	}
	now := p.Store.Clock()
	n, usd, err := p.Estimate(ctx, tenant, f, now)
	if err != nil {
		return nil, false, err
	}
	r = &store.Rerun{ID: id, Tenant: tenant, RerunID: rerunID, By: by, RequestHash: hash, Filter: f, Until: now,
		State: task.RerunRunning, Count: n, EstimatedCostUSD: usd}
	if n == 0 {
		r.State, r.Exhausted, r.CompletedAt = task.RerunCompleted, true, &now
	}
	err = p.Store.CreateRerun(ctx, r)
	if errors.Is(err, store.ErrExists) { // a concurrent request of the same id won
		r, err = p.existing(ctx, tenant, id, hash)
		return r, err == nil, err
	}
	return r, false, err
}

// existing returns re-run id when it is tenant's of the same filter.
func (p Planner) existing(ctx context.Context, tenant, id, hash string) (*store.Rerun, error) {
	r, err := p.Store.GetRerun(ctx, id)
	if err != nil {
		return nil, err
	}
	if r.Tenant != tenant || r.RequestHash != hash {
		return nil, ErrIDReused
	}
	return r, nil
}

// Get returns tenant's re-run named rerunID; another tenant's is not found.
func (p Planner) Get(ctx context.Context, tenant, rerunID string) (*store.Rerun, error) {
	r, err := p.Store.GetRerun(ctx, DocID(tenant, rerunID))
	if err != nil {
		return nil, err
	}
	if r.Tenant != tenant {
		return nil, fmt.Errorf("rerun %s: %w", rerunID, store.ErrNotFound)
	}
	return r, nil
}

// DocID is the reruns/{id} document of tenant's re-run rerunID: another tenant's id can never
// name it.
func DocID(tenant, rerunID string) string {
	sum := sha256.Sum256([]byte("genbox/rerun\x00" + tenant + "\x00" + rerunID))
	return hex.EncodeToString(sum[:16])
}

// filterHash is the SHA-256 of f's JSON (labels sorted by encoding/json).
func filterHash(f task.RerunFilter) (string, error) {
	b, err := json.Marshal(f)
	if err != nil {
		return "", fmt.Errorf("hash filter: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// randomID is a re-run id of 128 random bits.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "rr_" + hex.EncodeToString(b[:])
}
