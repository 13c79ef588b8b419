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
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
)

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

// run serves the interactions, admin, push and health routes (and pulls in pull mode) until ctx
// ends, then drains within the shutdown grace and flushes the publisher and telemetry.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := dlqnotifier.FromEnv(getenv)
	if err != nil {
		return err
	}
	ocfg, err := obs.ConfigFromEnv(getenv, "dlqnotifier")
	if err != nil {
		return err
	}
	log := ocfg.Logger(stdout)
	bg := context.WithoutCancel(ctx) // clients outlive ctx: they are needed while shutting down
	shutdownTelemetry, err := obs.Setup(bg, ocfg)
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
	st := store.New(fs)
	metrics, err := obs.NewMetrics(otel.GetMeterProvider())
	if err != nil {
		return err
	}
	svc := dlqnotifier.New(cfg, st, dlqnotifier.NewSlackClient(cfg), pub, nil, log, dlqnotifier.WithMetrics(metrics))
	checks := []obs.Check{{Name: "firestore", Probe: st.Ping}}
	var pulling obs.Running
	if cfg.Consumer == dlqnotifier.ConsumerPull {
		checks = append(checks, pulling.Check("pull"))
	}
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", obs.Ready(readyTimeout, checks...))
	mux.Handle("/", svc.Handler())

	ln, err := net.Listen("tcp", ":"+cfg.Port)
	if err != nil {
		return fmt.Errorf("%s: %w", dlqnotifier.EnvPort, err)
	}
	srv := &http.Server{Handler: obs.Handler(mux, "dlqnotifier"), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	pullCtx, stopPull := context.WithCancel(bg)
	defer stopPull()
	pulled := make(chan error, 1)
	if cfg.Consumer == dlqnotifier.ConsumerPull {
		pulling.Set(true, "")
		go func() { pulled <- svc.Run(pullCtx, ps) }()
	}
	log.InfoContext(ctx, "dlqnotifier started", "addr", ln.Addr().String(), "consumer", cfg.Consumer, "instance", cfg.Instance)

	var runErr error
	pullEnded := cfg.Consumer != dlqnotifier.ConsumerPull
	select {
	case <-ctx.Done():
	case err := <-served:
		runErr = fmt.Errorf("serve: %w", err)
	case runErr = <-pulled:
		pullEnded = true
	}
	pulling.Set(false, "shutting down")
	log.InfoContext(bg, "shutting down", "grace", cfg.ShutdownGrace.String())
	sctx, cancel := context.WithTimeout(bg, cfg.ShutdownGrace)
	defer cancel()
	stopPull()
	if !pullEnded {
		runErr = errors.Join(runErr, <-pulled)
	}
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		runErr = errors.Join(runErr, err)
	}
	return errors.Join(runErr, pub.Close(), shutdownTelemetry(sctx))
}
