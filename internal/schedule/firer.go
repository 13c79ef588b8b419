package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/internal/leader"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Intake submits a fire's task the way POST /v1/tasks submits a request (publisher.Intake): the
// same validation, the same task document, create-if-absent under an idempotency key.
type Intake interface {
	// Submit validates req and creates its task under the idempotency key for tenant, unless
	// the key's task exists; it returns the task's id and whether this call created it. A
	// refusal of the request is a *task.Problem with a 4xx status.
	Submit(ctx context.Context, tenant, key string, req *task.Request) (id string, created bool, err error)
	// TaskID is the id of the task Submit creates for tenant under key.
	TaskID(tenant, key string) string
}

// LeaderDoc is the leaders/{id} document whose lease makes one instance the firer.
const LeaderDoc = "scheduler"

// Config is the firer's cadence: the sweeper's (GENBOX_SWEEP_INTERVAL, GENBOX_SWEEP_LEADER_TTL,
// GENBOX_SWEEP_LIMIT), so a fire is as live as a due task.
type Config struct {
	Interval  time.Duration // time between passes
	LeaderTTL time.Duration // the leadership lease
	Limit     int           // schedules per pass
}

// Firer submits the due fires of every schedule. Run it in every worker instance: only the
// holder of the scheduler lease fires. Two firers that both believe they lead (a lease lapsed
// during a pass) still submit each fire once: its task's id derives from the schedule and the
// fire time, and the create is create-if-absent.
type Firer struct {
	store  *store.Store
	intake Intake
	cfg    Config
	owner  string
	log    *slog.Logger
}

// New returns a Firer leading as owner.
func New(st *store.Store, intake Intake, cfg Config, owner string, log *slog.Logger) *Firer {
	return &Firer{store: st, intake: intake, cfg: cfg, owner: owner, log: log}
}

// Run fires what is due every Interval while this instance holds the lease, until ctx ends; it
// then gives the lease up.
func (f *Firer) Run(ctx context.Context) {
	loop := &leader.Loop{Name: "scheduler", Interval: f.cfg.Interval, Log: f.log,
		Elector: f.store.Leader(LeaderDoc, f.owner, f.cfg.LeaderTTL)}
	loop.Run(ctx, func(ctx context.Context, _ int64) time.Time {
		if _, err := f.Pass(ctx); err != nil && ctx.Err() == nil {
			f.log.WarnContext(ctx, "schedule pass failed; next pass", "error", err)
		}
		return time.Time{}
	})
}

// Pass fires the due schedules, earliest due first, at most Limit of them, and returns how many
// fires it submitted.
func (f *Firer) Pass(ctx context.Context) (int, error) {
	due, err := f.store.DueSchedules(ctx, f.store.Clock(), f.cfg.Limit)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, sc := range due {
		fired, err := f.fire(ctx, sc)
		n += fired
		if err != nil && ctx.Err() == nil {
			f.log.WarnContext(ctx, "schedule not advanced; next pass", "schedule_id", sc.ID, "error", err)
		}
	}
	return n, ctx.Err()
}

// fire submits sc's due fires under its catch-up and overlap policies, then records them. A fire
// that cannot be submitted for a passing reason (Firestore unavailable) ends the pass's work on
// sc, which then resumes from that fire. A crash anywhere before the record submits the same
// fires again next pass, and finds their tasks.
func (f *Firer) fire(ctx context.Context, sc *store.Schedule) (int, error) {
	log := f.log.With("schedule_id", sc.ID, "tenant", sc.Tenant)
	spec, err := Parse(sc.Cron, sc.TimeZone)
	var tmpl task.Request
	if err == nil {
		err = json.Unmarshal([]byte(sc.Task), &tmpl)
	}
	if err != nil {
		// The publisher stores only what parses; a zone the tz database dropped can still fail.
		log.ErrorContext(ctx, "schedule unreadable; it fires no more", "error", err)
		return 0, f.store.AdvanceSchedule(ctx, sc, nil, nil, "", 0, 0, err.Error())
	}
	plan := spec.Plan(*sc.NextFireAt, f.store.Clock(), CatchUp(sc.CatchUp))
	next, prev := plan.Next, sc.LastTaskID
	var lastFire *time.Time
	fired, skipped, refused := 0, plan.Skipped, ""
	var stop error
	for _, at := range plan.Fire {
		key := FireKey(sc.ID, at)
		if Overlap(sc.Overlap) == OverlapSkip && prev != "" {
			busy, err := f.busy(ctx, prev, f.intake.TaskID(sc.Tenant, key))
			if err != nil {
				next, stop = at, err
				break
			}
			if busy {
				skipped++
				log.InfoContext(ctx, "fire skipped: the previous fire's task has not finished", "fire_at", at, "task_id", prev)
				continue
			}
		}
		req := Render(tmpl, at, spec.Location())
		id, _, err := f.intake.Submit(ctx, sc.Tenant, key, &req)
		if p := (*task.Problem)(nil); errors.As(err, &p) && p.Status < http.StatusInternalServerError {
			skipped++
			refused = fmt.Sprintf("fire at %s refused: %s", at.UTC().Format(time.RFC3339), p.Detail)
			log.WarnContext(ctx, "fire refused by the task validation", "fire_at", at, "error", err)
			continue
		}
		if err != nil {
			next, stop = at, err
			break
		}
		prev, fired, lastFire = id, fired+1, &at
		log.InfoContext(ctx, "schedule fired", "fire_at", at, "task_id", id)
	}
	err = f.store.AdvanceSchedule(ctx, sc, &next, lastFire, prev, fired, skipped, refused)
	if errors.Is(err, store.ErrChanged) {
		log.DebugContext(ctx, "schedule changed during its fire; the next pass reads it again")
		err = nil
	}
	return fired, errors.Join(stop, err)
}

// busy reports whether a fire must wait for the task prev of the previous fire: prev has not
// finished, and this fire's task (id) was not already submitted by a pass that crashed before
// recording it.
func (f *Firer) busy(ctx context.Context, prev, id string) (bool, error) {
	if prev == id {
		return false, nil
	}
	if _, err := f.store.GetTask(ctx, id); err == nil {
		return false, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	t, err := f.store.GetTask(ctx, prev)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !t.State.Finished(), nil
}
