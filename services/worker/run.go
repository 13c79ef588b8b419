package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/internal/worker"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

// run serves until ctx ends, then shuts down within the configured grace: it stops pulling, lets
// calls that finish within GENBOX_SHUTDOWN_GRACE persist, and makes the rest release their lease.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := worker.FromEnv(getenv)
	if err != nil {
		return err
	}
	reg, err := prompts.Load(cfg.PromptsDir)
	if err != nil {
		return err
	}
	ocfg, err := obs.ConfigFromEnv(getenv, "worker")
	if err != nil {
		return err
	}
	log := ocfg.Logger(stdout)
	// Clients outlive ctx: they are needed while shutting down.
	bg := context.WithoutCancel(ctx)
	shutdownTelemetry, err := obs.Setup(bg, ocfg)
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		if err := shutdownTelemetry(flush); err != nil {
			log.WarnContext(flush, "telemetry flush", "error", err)
		}
	}()
	metrics, err := obs.NewMetrics(otel.GetMeterProvider())
	if err != nil {
		return err
	}
	fs, err := firestore.NewClient(bg, cfg.Project)
	if err != nil {
		return fmt.Errorf("firestore: %w", err)
	}
	defer fs.Close()
	ps, err := pubsub.NewClient(bg, cfg.Project)
	if err != nil {
		return fmt.Errorf("pubsub: %w", err)
	}
	defer ps.Close()
	pub := bus.NewPublisher(ps)
	defer pub.Close()
	st := store.New(fs)
	gen, err := gemini.New(bg, cfg.Gemini, gemini.WithLogger(log), gemini.WithBreakerStore(worker.MeteredBreakers(st, metrics)),
		gemini.WithAttemptHook(worker.AttemptSpans()),
		gemini.WithAlerts(func(ctx context.Context, key, msg string) {
			if _, err := pub.Publish(ctx, bus.TopicAlerts, []byte(msg), map[string]string{task.AttrKind: "alert", task.AttrAlert: key}); err != nil {
				log.WarnContext(ctx, "alert not published", "alert_key", key, "error", err)
			}
		}))
	if err != nil {
		return err
	}
	mp := cfg.ModelPolicy(st, gen)
	h := worker.New(st, gen, reg, pub, log, cfg.Policy(), worker.WithMetrics(metrics), worker.WithModelPolicy(mp))
	sw := sweeper.New(st, pub, gen, log, cfg.Sweep, cfg.Instance, sweeper.WithMetrics(metrics))

	ln, err := net.Listen("tcp", ":"+cfg.Port)
	if err != nil {
		return fmt.Errorf("PORT: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	var pulling obs.Running
	mux.Handle("GET /readyz", obs.Ready(readyTimeout, obs.Check{Name: "firestore", Probe: st.Ping}, pulling.Check("pull")))
	srv := &http.Server{Handler: obs.Handler(mux, "worker"), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.InfoContext(ctx, "worker started", "addr", ln.Addr().String(), "instance", cfg.Instance, "subscription", cfg.Subscription)

	sweepCtx, stopSweep := context.WithCancel(bg)
	swept := make(chan struct{})
	go func() { defer close(swept); _ = sw.Run(sweepCtx) }()
	flushed := make(chan struct{})
	go func() { defer close(flushed); worker.FlushSpend(sweepCtx, log, mp.Budgets, cfg.TenantRefresh) }()

	pullCtx, stopPull := context.WithCancel(bg)
	pulled := make(chan error, 1)
	pulling.Set(true, "")
	go func() {
		pulled <- bus.Pull(pullCtx, ps, cfg.Subscription, bus.PullSettings{
			MaxOutstandingMessages: cfg.Concurrency, MaxExtension: cfg.MaxExtension,
		}, h)
	}()

	var runErr error
	pullEnded := false
	select {
	case <-ctx.Done():
	case runErr = <-pulled:
		pullEnded = true
	case err := <-serveErr:
		runErr = fmt.Errorf("healthz server: %w", err)
	}
	pulling.Set(false, "shutting down")
	log.InfoContext(bg, "shutting down", "grace", cfg.ShutdownGrace.String())
	stopPull()
	abort := time.AfterFunc(cfg.ShutdownGrace, h.Abort) // what cannot finish in time releases its lease
	if !pullEnded {
		runErr = errors.Join(runErr, <-pulled) // in-flight handlers have returned
	}
	abort.Stop()
	stopSweep()
	<-swept
	<-flushed
	shutdownCtx, cancel := context.WithTimeout(bg, time.Second)
	defer cancel()
	// The results nudges of calls that finished during the grace are flushed before telemetry.
	return errors.Join(runErr, srv.Shutdown(shutdownCtx), pub.Close())
}
