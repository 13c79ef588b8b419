package worker

import (
	"context"
	"log/slog"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/batcher"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/internal/schedule"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Settings are the worker's configuration and the prompt families it renders: what is read and
// checked before any client is opened, so that a bad value stops the start naming its variable.
type Settings struct {
	Config  Config
	prompts *prompts.Registry
	rerun   rerun.Config
}

// Load reads the configuration (FromEnv), the re-run pacer's (rerun.FromEnv) and the families
// of GENBOX_PROMPTS_DIR.
func Load(getenv func(string) string) (Settings, error) {
	cfg, err := FromEnv(getenv)
	if err != nil {
		return Settings{}, err
	}
	reg, err := prompts.Load(cfg.PromptsDir)
	if err != nil {
		return Settings{}, err
	}
	rc, err := rerun.FromEnv(getenv, cfg.NudgeGrace)
	if err != nil {
		return Settings{}, err
	}
	return Settings{Config: cfg, prompts: reg, rerun: rc}, nil
}

// Infra is what the caller opened for the worker: the services/worker process or the in-process
// dev stack.
type Infra struct {
	Store *store.Store
	// Publisher carries the handler's nudges and the model's alerts.
	Publisher Publisher
	// SweeperPublisher carries the sweeper's nudges; nil: Publisher.
	SweeperPublisher sweeper.Publisher
	Log              *slog.Logger
	// Metrics records the worker's, the sweeper's and the breakers' metrics; nil records none.
	Metrics *obs.Metrics
	// Objects reads the files tasks name; nil: tasks with files fail.
	Objects ObjectReader
}

// Assembly is the worker as a process runs it. The caller pulls Subscription into Handler with
// Pull and runs Background beside it; when the pull has stopped it cancels Background and waits
// for it. Calls that cannot finish within Config.ShutdownGrace of the pull's cancellation are
// made to release their lease by Handler.Abort.
type Assembly struct {
	Handler      *Handler
	Subscription string
	Pull         bus.PullSettings
	// Local takes the due tasks this instance's sweeper finds while Consume runs.
	Local *Local
	// Background are the breaker listener, the sweeper, the batcher, the schedule firer, the re-run pacer, the spend flush and, when
	// configured, the fallback drill; the flush writes once more when its context ends, so the
	// spend of the calls that finished during the grace is counted.
	Background []func(ctx context.Context)

	grace   time.Duration
	ready   []obs.Check
	started []any
	gate    func(pull func(ctx context.Context) error) func(ctx context.Context) error // the pool's drains; nil: none
}

// Consume pulls Subscription into h (Handler, or a wrapper of it) and runs Local beside it until
// ctx ends, then returns once both have finished what they took.
func (a *Assembly) Consume(ctx context.Context, ps *pubsub.Client, h bus.Handler) error {
	done := make(chan struct{})
	go func() { defer close(done); a.Local.Run(ctx) }()
	err := bus.Pull(ctx, ps, a.Subscription, a.Pull, h)
	<-done
	return err
}

// Assemble builds the worker of s over in: the model client (its breakers metered and stored,
// each attempt a span, its alerts published to the alerts topic), the model policy, the message
// handler, the sweeper, the batcher (one leader per primary model of the families and the
// default chain), the re-run pacer and the spend flush. The model client outlives ctx.
func Assemble(ctx context.Context, s Settings, in Infra) (*Assembly, error) {
	cfg, log := s.Config, in.Log
	gen, err := gemini.New(context.WithoutCancel(ctx), cfg.Gemini, gemini.WithLogger(log),
		gemini.WithBreakerStore(MeteredBreakers(in.Store, in.Metrics)), gemini.WithAttemptHook(AttemptSpans(GenAIProvider(cfg.Gemini.Backend), in.Metrics)),
		gemini.WithAlerts(func(ctx context.Context, key, msg string) {
			if _, err := in.Publisher.Publish(ctx, bus.TopicAlerts, []byte(msg), map[string]string{task.AttrKind: task.AttrKindAlert, task.AttrAlert: key}); err != nil {
				log.WarnContext(ctx, "alert not published", "alert_key", key, "error", err)
			}
		}))
	if err != nil {
		return nil, err
	}
	mp := cfg.ModelPolicy(in.Store, gen)
	if cfg.ContextTTL > 0 {
		mp.ContextCaches = NewContextCaches(in.Store, gen, cfg.Gemini.Pricing, cfg.ContextTTL, cfg.Gemini.InstanceShare, cfg.Instance, in.Metrics, mp.Budgets)
	}
	opts := []Option{WithModelPolicy(mp), WithMetrics(in.Metrics), WithCapacity(cfg.Concurrency, cfg.ClaimAhead, cfg.MaxInFlight),
		WithTenantSlots(cfg.TenantWaitMax), WithFairShares(cfg.Gemini.InstanceShare)}
	if in.Objects != nil {
		opts = append(opts, WithFiles(Files{Copier: gen, Objects: in.Objects, Margin: DefaultCopyMargin}))
	}
	if cfg.Gemini.Backend == gemini.BackendGemini {
		opts = append(opts, WithBatch(cfg.Batch)) // Vertex AI's batch jobs read Cloud Storage or BigQuery, not inlined requests
	} else {
		log.InfoContext(ctx, "batch-mode tasks run online: batch jobs of inlined requests need the Gemini API backend")
	}
	h := New(in.Store, gen, s.prompts, in.Publisher, log, cfg.Policy(), opts...)
	bt := batcher.New(in.Store, gen, h, s.prompts.PrimaryModels(cfg.Gemini.Models), cfg.Batch, cfg.Instance, log.With("component", "batcher"), in.Metrics)
	swPub := in.SweeperPublisher
	if swPub == nil {
		swPub = in.Publisher
	}
	local := NewLocal(h)
	// One snapshot listener on breakers/{model} serves the model client (an outage, probe or
	// recovery one instance saw is every instance's) and the sweeper (a recovery releases the
	// tasks parked on the chain at once).
	breakers := in.Store.WatchBreakers(log.With("component", "breakers"))
	breakers.Observe(func(st gemini.BreakerStatus) {
		gen.ObserveBreaker(st)
		in.Metrics.Breaker(context.Background(), st.Model, string(st.State))
	})
	sw := sweeper.New(in.Store, swPub, cfg.Gemini.Models, log.With("component", "sweeper"), cfg.Sweep, cfg.Instance,
		sweeper.WithMetrics(in.Metrics), sweeper.WithLocal(local), sweeper.WithBreakers(breakers))
	intake := publisher.NewIntake(publisher.IntakeDeps{Store: in.Store, Publisher: in.Publisher, Families: s.prompts,
		Callbacks: cfg.Callbacks, Log: log.With("component", "scheduler"), Metrics: in.Metrics})
	firer := schedule.New(in.Store, intake, schedule.Config{Interval: cfg.Sweep.Interval, LeaderTTL: cfg.Sweep.LeaderTTL, Limit: cfg.Sweep.Limit},
		cfg.Instance, log.With("component", "scheduler"))
	a := &Assembly{
		Handler:      h,
		Subscription: cfg.Subscription,
		Pull:         bus.PullSettings{MaxOutstandingMessages: cfg.MaxInFlight, MaxExtension: cfg.MaxExtension},
		Local:        local,
		grace:        cfg.ShutdownGrace,
		ready:        []obs.Check{{Name: "firestore", Probe: in.Store.Ping}},
		started:      []any{"instance", cfg.Instance, "subscription", cfg.Subscription},
		Background: []func(context.Context){
			breakers.Run,
			func(ctx context.Context) { _ = sw.Run(ctx) },
			bt.Run,
			h.RunFairShares,
			firer.Run,
			rerun.NewPacer(in.Store, in.Publisher, s.prompts, mp.Tenants, s.rerun, cfg.Instance, log.With("component", "rerun")).Run,
			func(ctx context.Context) { FlushSpend(ctx, log, mp.Budgets, cfg.TenantRefresh) },
			func(ctx context.Context) { FlushRates(ctx, log, mp.Rates, cfg.TenantRefresh) },
		},
	}
	if cfg.Autoscale.Enabled() {
		pool, err := autoscale.OpenCloudRun(context.WithoutCancel(ctx), cfg.Autoscale)
		if err != nil {
			return nil, err
		}
		alog := log.With("component", "autoscaler")
		ctrl := autoscale.NewController(cfg.Autoscale, in.Store, pool, cfg.Instance, alog)
		a.gate = autoscale.NewMember(cfg.Autoscale, in.Store.FS, cfg.Instance, h.Load,
			func(share float64) { gen.SetInstanceShare(share); h.SetInstanceShare(share) }, alog).Gate
		a.Background = append(a.Background, func(ctx context.Context) { ctrl.Run(ctx); _ = pool.Close() })
	}
	if cfg.DrillEvery > 0 {
		d := &Drill{Store: in.Store, Models: gen, Catalog: s.prompts, Pub: in.Publisher, Log: log.With("component", "fallback-drill"),
			Metrics: in.Metrics, Every: cfg.DrillEvery}
		a.Background = append(a.Background, d.Run)
	}
	return a, nil
}
