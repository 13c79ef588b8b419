package publisher

import (
	"context"
	"errors"
	"log/slog"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Intake is POST /v1/tasks's submission path for callers inside genbox — a schedule's fires
// (internal/schedule) — so their tasks are validated, written, counted and nudged exactly as a
// client's: the same submit, with an idempotency key naming the fire. The submit rate limit is a
// client's and does not apply.
type Intake struct{ s *Server }

// IntakeDeps are what an Intake needs outside the publisher: the store, the nudge publisher, the
// families, the callback URL policy (the publisher's GENBOX_ALLOW_INSECURE_CALLBACKS and
// GENBOX_CALLBACK_PORTS), the log and the metrics (nil records none).
type IntakeDeps struct {
	Store     *store.Store
	Publisher Publisher
	Families  Families
	Callbacks ssrf.URLPolicy
	Log       *slog.Logger
	Metrics   *obs.Metrics
}

// NewIntake returns an Intake with the publisher's default timeouts and nudge grace.
func NewIntake(d IntakeDeps) *Intake {
	cfg := DefaultConfig()
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Intake{s: &Server{cfg: cfg, st: d.Store, pub: d.Publisher, families: d.Families, log: log, metrics: d.Metrics,
		slots: store.NewSlotHints(d.Store), checkURL: func(u string) error { return ssrf.CheckURL(u, d.Callbacks) }}}
}

// Submit validates req and creates its task for tenant under key, unless key's task exists: it
// returns the task's id and whether this call created it. A refusal is a *task.Problem. The task
// of key found with another request (its template changed since it was submitted) is still that
// key's task.
func (in *Intake) Submit(ctx context.Context, tenant, key string, req *task.Request) (string, bool, error) {
	res, err := in.s.submit(ctx, tenant, key, req)
	if p := (*task.Problem)(nil); errors.As(err, &p) && p.Type == probIdemMismatch {
		return in.TaskID(tenant, key), false, nil
	}
	if err != nil {
		return "", false, err
	}
	return res.t.ID, !res.replayed, nil
}

// TaskID is the id of the task Submit creates for tenant under key.
func (in *Intake) TaskID(tenant, key string) string { return derivedID(tenant, key) }
