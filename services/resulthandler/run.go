package main

import (
	"context"
	"io"

	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/service"
)

// run serves the probes (and the push endpoint in push mode, or pulls in pull mode) until ctx
// ends, then lets in-flight deliveries finish within the shutdown grace and flushes the
// publisher and telemetry.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := resulthandler.FromEnv(getenv)
	if err != nil {
		return err
	}
	d, err := service.Open(ctx, "resulthandler", cfg.Project, getenv, stdout)
	if err != nil {
		return err
	}
	defer d.Close(ctx)
	st, err := d.OpenStore(ctx, cfg.SweepShards, cfg.SecretsKey)
	if err != nil {
		return err
	}
	a, err := resulthandler.Assemble(cfg, resulthandler.Infra{Store: st, Publisher: d.Publisher, Log: d.Log, Metrics: d.Metrics})
	if err != nil {
		return err
	}
	return d.ListenAndServe(ctx, cfg.Port, a.Lifecycle(d.PubSub, a.Handler))
}
