package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// shutdownBudget bounds the drain after SIGTERM, inside Cloud Run's 10 s grace.
const shutdownBudget = 8 * time.Second

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

// run serves the API until ctx ends, then drains in-flight requests and flushes the publisher
// and telemetry.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := publisher.FromEnv(getenv)
	if err != nil {
		return err
	}
	ocfg, err := obs.ConfigFromEnv(getenv, "publisher")
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := ocfg.Logger(stdout)
	bg := context.WithoutCancel(ctx) // clients outlive ctx: they are needed while shutting down
	shutdownTelemetry, err := obs.Setup(bg, ocfg)
	if err != nil {
		return err
	}
	reg, err := prompts.Load(cfg.PromptsDir)
	if err != nil {
		return fmt.Errorf("%s: %w", publisher.EnvPromptsDir, err)
	}
	fs, err := firestore.NewClient(bg, cfg.ProjectID)
	if err != nil {
		return fmt.Errorf("firestore: %w", err)
	}
	defer fs.Close()
	ps, err := pubsub.NewClient(bg, cfg.ProjectID)
	if err != nil {
		return fmt.Errorf("pubsub: %w", err)
	}
	defer ps.Close()
	metrics, err := obs.NewMetrics(otel.GetMeterProvider())
	if err != nil {
		return err
	}
	pub := bus.NewPublisher(ps)
	st := store.New(fs)
	h, err := publisher.New(cfg, publisher.Deps{Store: st, Publisher: pub, Families: reg, Log: log, Metrics: metrics})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", obs.Ready(readyTimeout, obs.Check{Name: "firestore", Probe: st.Ping}))
	mux.Handle("/", h)
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(cfg.Port))
	if err != nil {
		return fmt.Errorf("%s: %w", publisher.EnvPort, err)
	}
	srv := &http.Server{Handler: obs.Handler(mux, "publisher"), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.InfoContext(ctx, "publisher started", "addr", ln.Addr().String(), "project", cfg.ProjectID, "admin", cfg.AdminKey != "")

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-served:
		runErr = fmt.Errorf("serve: %w", err)
	}
	log.InfoContext(bg, "shutting down")
	sctx, cancel := context.WithTimeout(bg, shutdownBudget)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		runErr = errors.Join(runErr, err)
	}
	return errors.Join(runErr, pub.Close(), shutdownTelemetry(sctx))
}
