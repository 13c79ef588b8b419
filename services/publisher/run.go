package main

import (
	"context"
	"io"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/service"
)

// run serves the API until ctx ends, then drains in-flight requests and flushes the publisher
// and telemetry.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	set, err := publisher.Load(getenv)
	if err != nil {
		return err
	}
	cfg := set.Config
	d, err := service.Open(ctx, "publisher", cfg.ProjectID, getenv, stdout)
	if err != nil {
		return err
	}
	defer d.Close(ctx)
	st, err := d.OpenStore(ctx, cfg.SweepShards, cfg.SecretsKey)
	if err != nil {
		return err
	}
	pub, closePool, err := autoscale.WakingPublisher(ctx, cfg.Autoscale, d.Firestore, d.Publisher, d.Log)
	if err != nil {
		return err
	}
	defer func() { _ = closePool() }()
	in := publisher.Infra{Store: st, Publisher: pub, Log: d.Log, Metrics: d.Metrics}
	if cfg.InputBucket != "" || getenv(objects.EnvEmulatorHost) != "" {
		// Cloud Storage with the service's own credentials (upload URLs signed as the service
		// account, through IAM signBlob), or the emulator STORAGE_EMULATOR_HOST names.
		objs, err := objects.New(ctx, objects.Signer{})
		if err != nil {
			return err
		}
		defer objs.Close()
		in.Objects = objs
	}
	a, err := publisher.Assemble(set, in)
	if err != nil {
		return err
	}
	return d.ListenAndServe(ctx, cfg.Port, a.Lifecycle())
}
