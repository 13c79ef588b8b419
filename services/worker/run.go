package main

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/worker"
)

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

// run pulls tasks and runs the sweeper and the spend flush until ctx ends, then shuts down within
// the configured grace: it stops pulling, lets calls that finish within GENBOX_SHUTDOWN_GRACE
// persist, makes the rest release their lease, and flushes the publisher and telemetry.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	set, err := worker.Load(getenv)
	if err != nil {
		return err
	}
	cfg := set.Config
	d, err := service.Open(ctx, "worker", cfg.Project, getenv, stdout)
	if err != nil {
		return err
	}
	defer d.Close(ctx)
	st := store.New(d.Firestore)
	a, err := worker.Assemble(ctx, set, worker.Infra{Store: st, Publisher: d.Publisher, Log: d.Log, Metrics: d.Metrics})
	if err != nil {
		return err
	}

	pulling := new(obs.Running)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("GET /readyz", obs.Ready(d.Log, readyTimeout, obs.Check{Name: "firestore", Probe: st.Ping}, pulling.Check("pull")))
	ln, err := service.Listen(cfg.Port)
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln, service.Lifecycle{
		Handler: mux, Grace: cfg.ShutdownGrace, Pulling: pulling,
		Pull: func(ctx context.Context) error { return a.Consume(ctx, d.PubSub, a.Handler) },
		// What cannot finish within the grace releases its lease.
		Abort:      a.Handler.Abort,
		Background: a.Background,
		Started:    []any{"instance", cfg.Instance, "subscription", cfg.Subscription},
	})
}
