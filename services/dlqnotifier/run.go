package main

import (
	"context"
	"io"
	"net/http"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/console"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/service"
)

// run serves the interactions, admin, push, console and health routes (and pulls in pull mode)
// until ctx ends, then drains within the shutdown grace and flushes the publisher and telemetry.
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
	st, err := d.OpenStore(ctx, cfg.SweepShards, "")
	if err != nil {
		return err
	}
	pub, closePool, err := autoscale.WakingPublisher(ctx, cfg.Autoscale, d.Firestore, d.Publisher, d.Log)
	if err != nil {
		return err
	}
	defer func() { _ = closePool() }()
	svc := dlqnotifier.Assemble(set, dlqnotifier.Infra{Store: st, Publisher: pub, Log: d.Log, Metrics: d.Metrics})
	con, err := console.New(console.Config{AdminKey: cfg.AdminKey, ProxyHops: cfg.ProxyHops}, console.Deps{Store: st, Decider: svc, Estimator: svc, Pricing: cfg.Pricing, Prompts: set.Prompts(), Log: d.Log})
	if err != nil {
		return err
	}
	return d.ListenAndServe(ctx, cfg.Port, svc.Lifecycle(d.PubSub, map[string]http.Handler{console.Prefix: con}))
}
