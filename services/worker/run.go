package main

import (
	"context"
	"io"

	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/worker"
)

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
	st, err := d.OpenStore(ctx, cfg.Sweep.Shards, "")
	if err != nil {
		return err
	}
	in := worker.Infra{Store: st, Publisher: d.Publisher, Log: d.Log, Metrics: d.Metrics}
	if set.Config.InputBucket != "" || getenv(objects.EnvEmulatorHost) != "" {
		// Cloud Storage with the service's own credentials, or the emulator
		// STORAGE_EMULATOR_HOST names: the files of tasks, read at their recorded generation.
		objs, err := objects.New(ctx, objects.Signer{})
		if err != nil {
			return err
		}
		defer objs.Close()
		in.Objects = objs
	}
	a, err := worker.Assemble(ctx, set, in)
	if err != nil {
		return err
	}
	return d.ListenAndServe(ctx, cfg.Port, a.Lifecycle(d.PubSub, a.Handler))
}
