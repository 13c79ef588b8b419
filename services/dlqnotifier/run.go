package main

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/internal/console"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
)

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

// run serves the interactions, admin, push, console and health routes (and pulls in pull mode) until ctx
// ends, then drains within the shutdown grace and flushes the publisher and telemetry.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	set, err := dlqnotifier.Load(getenv)
	if err != nil {
		return err
	}
	cfg := set.Config
	d, err := service.Open(ctx, "dlqnotifier", cfg.Project, getenv, stdout)
	if err != nil {
		return err
	}
	defer d.Close(ctx)
	st := store.New(d.Firestore)
	svc := dlqnotifier.Assemble(set, dlqnotifier.Infra{Store: st, Publisher: d.Publisher, Log: d.Log, Metrics: d.Metrics})
	checks := []obs.Check{{Name: "firestore", Probe: st.Ping}}
	// Public: Slack and admins call it from the internet.
	l := service.Lifecycle{Public: true, Grace: cfg.ShutdownGrace, Started: []any{"consumer", cfg.Consumer, "instance", cfg.Instance}}
	if cfg.Consumer == dlqnotifier.ConsumerPull {
		l.Pulling = new(obs.Running)
		checks = append(checks, l.Pulling.Check("pull"))
		l.Pull = func(ctx context.Context) error { return svc.Run(ctx, d.PubSub) }
	}
	con, err := console.New(console.Config{AdminKey: cfg.AdminKey}, console.Deps{Store: st, Decider: svc, Estimator: svc, Pricing: cfg.Pricing, Log: d.Log})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", obs.Ready(d.Log, readyTimeout, checks...))
	mux.Handle(console.Prefix, con)
	mux.Handle("/", svc.Handler())
	l.Handler = mux

	ln, err := service.Listen(cfg.Port)
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln, l)
}
