package main

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/internal/worker"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

// run pulls tasks and runs the sweeper and the spend flush until ctx ends, then shuts down within
// the configured grace: it stops pulling, lets calls that finish within GENBOX_SHUTDOWN_GRACE
// persist, makes the rest release their lease, and flushes the publisher and telemetry.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := worker.FromEnv(getenv)
	if err != nil {
		return err
	}
	reg, err := prompts.Load(cfg.PromptsDir)
	if err != nil {
		return err
	}
	d, err := service.Open(ctx, "worker", cfg.Project, getenv, stdout)
	if err != nil {
		return err
	}
	defer d.Close(ctx)
	st := store.New(d.Firestore)
	gen, err := gemini.New(context.WithoutCancel(ctx), cfg.Gemini, gemini.WithLogger(d.Log),
		gemini.WithBreakerStore(worker.MeteredBreakers(st, d.Metrics)), gemini.WithAttemptHook(worker.AttemptSpans()),
		gemini.WithAlerts(func(ctx context.Context, key, msg string) {
			if _, err := d.Publisher.Publish(ctx, bus.TopicAlerts, []byte(msg), map[string]string{task.AttrKind: "alert", task.AttrAlert: key}); err != nil {
				d.Log.WarnContext(ctx, "alert not published", "alert_key", key, "error", err)
			}
		}))
	if err != nil {
		return err
	}
	mp := cfg.ModelPolicy(st, gen)
	h := worker.New(st, gen, reg, d.Publisher, d.Log, cfg.Policy(), worker.WithMetrics(d.Metrics), worker.WithModelPolicy(mp))
	sw := sweeper.New(st, d.Publisher, gen, d.Log, cfg.Sweep, cfg.Instance, sweeper.WithMetrics(d.Metrics))

	pulling := new(obs.Running)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("GET /readyz", obs.Ready(readyTimeout, obs.Check{Name: "firestore", Probe: st.Ping}, pulling.Check("pull")))
	ln, err := service.Listen(cfg.Port)
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln, service.Lifecycle{
		Handler: mux, Grace: cfg.ShutdownGrace, Pulling: pulling,
		Pull: func(ctx context.Context) error {
			return bus.Pull(ctx, d.PubSub, cfg.Subscription, bus.PullSettings{
				MaxOutstandingMessages: cfg.Concurrency, MaxExtension: cfg.MaxExtension,
			}, h)
		},
		// What cannot finish within the grace releases its lease.
		Abort: h.Abort,
		// The spend of calls that finish during the grace is flushed once they have.
		Background: []func(context.Context){
			func(ctx context.Context) { _ = sw.Run(ctx) },
			func(ctx context.Context) { worker.FlushSpend(ctx, d.Log, mp.Budgets, cfg.TenantRefresh) },
		},
		Started: []any{"instance", cfg.Instance, "subscription", cfg.Subscription},
	})
}
