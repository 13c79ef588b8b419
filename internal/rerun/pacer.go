package rerun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/internal/leader"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Publisher publishes a started task's nudge (bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

// TenantLimits returns a tenant's limits (worker.TenantCache).
type TenantLimits interface {
	Limits(ctx context.Context, tenant string) (store.Limits, error)
}

var _ Publisher = (*bus.Publisher)(nil)

// Config is the pacer's configuration.
type Config struct {
	// Interval is the time between passes (GENBOX_RERUN_INTERVAL, default 2s).
	Interval time.Duration
	// Page is the most tasks one page reads (GENBOX_RERUN_PAGE, default 50).
	Page int
	// Window is the most tasks of one re-run in flight — started and not ended — when its tenant
	// sets no concurrency cap; with one, the cap is the window (GENBOX_RERUN_WINDOW, default 50).
	Window int
	// LeaseTTL is how long a pacer holds a re-run between writes: after a crash another
	// instance resumes it that much later (five intervals).
	LeaseTTL time.Duration
	// Hold keeps the sweeper off a started task while the pacer's nudge is in flight
	// (GENBOX_NUDGE_GRACE, the worker's).
	Hold time.Duration
}

// ErrConfig means a pacer setting is invalid; the message names the variable.
var ErrConfig = errors.New("rerun: invalid configuration")

// FromEnv reads the pacer's configuration with defaults; hold is the worker's nudge grace.
func FromEnv(getenv func(string) string, hold time.Duration) (Config, error) {
	c := Config{Interval: 2 * time.Second, Page: 50, Window: 50, Hold: hold}
	r := envconfig.New(getenv)
	r.Duration("GENBOX_RERUN_INTERVAL", &c.Interval)
	r.Int("GENBOX_RERUN_PAGE", &c.Page)
	r.Int("GENBOX_RERUN_WINDOW", &c.Window)
	if err := r.Err(); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c.LeaseTTL = 5 * c.Interval
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("%w: GENBOX_RERUN_INTERVAL must be positive", ErrConfig))
	}
	if c.Page < 1 {
		errs = append(errs, fmt.Errorf("%w: GENBOX_RERUN_PAGE must be at least 1", ErrConfig))
	}
	if c.Window < 1 {
		errs = append(errs, fmt.Errorf("%w: GENBOX_RERUN_WINDOW must be at least 1", ErrConfig))
	}
	return c, errors.Join(errs...)
}

// Pacer starts the replays of running re-runs. Run it in every worker instance: a re-run is
// advanced by the instance holding its lease, one page at a time, and never by two at once. A
// page's tasks are started one by one, each marked with the re-run (protocol.Task.StartRerun);
// the cursor and the counts move in one conditioned write after the page. A pacer that dies
// in between leaves the cursor before the page: whoever takes the lease next replays it, finds
// the tasks already started by their mark, and counts them without starting them again. A task
// whose nudge was lost with the pacer is the sweeper's once the hold ends.
type Pacer struct {
	store   *store.Store
	pub     Publisher
	prompts Catalog
	tenants TenantLimits
	cfg     Config
	owner   string
	log     *slog.Logger
}

// NewPacer returns a pacer holding re-runs' leases as owner.
func NewPacer(st *store.Store, pub Publisher, prompts Catalog, tenants TenantLimits, cfg Config, owner string, log *slog.Logger) *Pacer {
	return &Pacer{store: st, pub: pub, prompts: prompts, tenants: tenants, cfg: cfg, owner: owner, log: log}
}

// Run makes a pass every Interval until ctx ends. Every instance passes: each re-run's own lease
// (advance) picks the one that advances it.
func (p *Pacer) Run(ctx context.Context) {
	loop := &leader.Loop{Name: "rerun pacer", Interval: p.cfg.Interval, Log: p.log}
	loop.Run(ctx, func(ctx context.Context, _ int64) time.Time {
		if err := p.Pass(ctx); err != nil && ctx.Err() == nil {
			p.log.WarnContext(ctx, "rerun pass failed; retried next interval", "error", err)
		}
		return time.Time{}
	})
}

// Pass advances every running re-run whose lease is free or this pacer's.
func (p *Pacer) Pass(ctx context.Context) error {
	reruns, err := p.store.RunningReruns(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range reruns {
		if err := p.advance(ctx, r); err != nil && !errors.Is(err, store.ErrChanged) {
			errs = append(errs, fmt.Errorf("rerun %s: %w", r.ID, err))
		}
	}
	return errors.Join(errs...)
}

// advance takes r's lease, refreshes its counts and starts pages of tasks while the window has
// room, then completes r once no task is left and none is in flight.
func (p *Pacer) advance(ctx context.Context, r *store.Rerun) error {
	now := p.store.Clock()
	if r.Lease.Renew(p.owner, r.Lease.Epoch, now, p.cfg.LeaseTTL) != nil {
		if err := r.Lease.Take(p.owner, now, p.cfg.LeaseTTL); err != nil {
			return nil // another pacer's
		}
	}
	if err := p.store.SaveRerun(ctx, r); err != nil {
		return err
	}
	log := p.log.With("rerun_id", r.RerunID, "tenant", r.Tenant)
	window := p.cfg.Window
	if l, err := p.tenants.Limits(ctx, r.Tenant); err != nil {
		return err
	} else if l.Concurrency > 0 {
		window = l.Concurrency
	}
	for ctx.Err() == nil {
		c, err := p.store.RerunCounts(ctx, r.ID)
		if err != nil {
			return err
		}
		r.Progress.Done, r.Progress.Failed = c.Done, c.Failed
		if r.Exhausted {
			if c.InFlight == 0 {
				done := p.store.Clock()
				r.State, r.CompletedAt = task.RerunCompleted, &done
				r.Lease.Clear()
				log.InfoContext(ctx, "rerun completed", "started", r.Progress.Started, "done", c.Done, "failed", c.Failed)
			}
			return p.store.SaveRerun(ctx, r)
		}
		room := window - c.InFlight
		if room <= 0 {
			return p.store.SaveRerun(ctx, r)
		}
		if err := p.page(ctx, log, r, min(room, p.cfg.Page)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// page starts the next limit tasks of r after its cursor that match and can be re-run, then
// commits the cursor and the counts (renewing the lease) and nudges what it started.
func (p *Pacer) page(ctx context.Context, log *slog.Logger, r *store.Rerun, limit int) error {
	tasks, last, err := p.store.RerunPage(ctx, r, limit)
	if err != nil {
		return err
	}
	var progress task.RerunProgress
	var nudge []*protocol.Task
	for _, t := range tasks {
		o, got, err := p.start(ctx, r, t)
		if err != nil {
			return err // the page is replayed: what was started is found by its mark
		}
		switch o {
		case startedNow:
			nudge = append(nudge, got)
			fallthrough
		case startedBefore:
			progress.Matched++
			progress.Started++
		case skipped:
			progress.Matched++
			progress.Skipped++
		}
	}
	if len(tasks) > 0 {
		end := tasks[len(tasks)-1]
		r.Cursor = &store.RerunCursor{CreatedAt: end.CreatedAt, ID: end.ID}
	}
	r.Exhausted = last
	r.Progress.Matched += progress.Matched
	r.Progress.Started += progress.Started
	r.Progress.Skipped += progress.Skipped
	if err := r.Lease.Renew(p.owner, r.Lease.Epoch, p.store.Clock(), p.cfg.LeaseTTL); err != nil {
		return err
	}
	if err := p.store.SaveRerun(ctx, r); err != nil {
		return err
	}
	for _, t := range nudge {
		attrs := map[string]string{task.AttrTaskID: t.ID, task.AttrTenant: t.Tenant, task.AttrFamily: t.Family, task.AttrVariant: t.Variant}
		if _, err := p.pub.Publish(ctx, bus.TopicTasks, nil, attrs); err != nil {
			log.WarnContext(ctx, "rerun nudge not published; the sweeper will nudge the task", "task_id", t.ID, "error", err)
		}
	}
	log.InfoContext(ctx, "rerun page committed", "started", progress.Started, "skipped", progress.Skipped, "exhausted", last)
	return nil
}

// outcome is what a page did with one task.
type outcome int

const (
	unmatched     outcome = iota
	startedNow            // this page started its new replay
	startedBefore         // a replayed page found it started by this re-run
	skipped               // it matched but could not be re-run (Blocked, or its variant retired)
)

// start starts t's new replay for r unless r started it already, under the current version of
// its variant; t is the task as the page read it, so an unchanged task is written without
// another read.
func (p *Pacer) start(ctx context.Context, r *store.Rerun, t *protocol.Task) (outcome, *protocol.Task, error) {
	if t.Rerun == r.ID {
		return startedBefore, t, nil
	}
	if !Matches(r.Filter, t) {
		return unmatched, t, nil
	}
	if Blocked(t) != "" {
		return skipped, t, nil
	}
	rendered, err := p.prompts.Render(t.Family, t.Variant, t.Input, t.GenConfig)
	if err != nil {
		return skipped, t, nil
	}
	o := unmatched
	got, err := p.store.MutateTaskFrom(ctx, t, func(t *protocol.Task, now time.Time) error {
		switch {
		case t.Rerun == r.ID:
			o = startedBefore
		case !Matches(r.Filter, t):
			o = unmatched
		case Blocked(t) != "":
			o = skipped
		default:
			o = startedNow
			t.StartRerun(r.ID, rendered.Version, now.Add(p.cfg.Hold))
			return nil
		}
		return store.ErrNoChange
	})
	if err != nil {
		return unmatched, nil, fmt.Errorf("start task %s: %w", t.ID, err)
	}
	return o, got, nil
}
