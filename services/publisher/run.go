package main

import (
	"context"
	"fmt"
	"io"

	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
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
	st := store.New(d.Firestore)
	st.Shards = cfg.SweepShards
	box, closeBox, err := secretbox.FromKey(ctx, cfg.SecretsKey)
	if err != nil {
		return fmt.Errorf("%s: %w", secretbox.EnvKey, err)
	}
	defer func() { _ = closeBox() }()
	st.Secrets = box
	a, err := publisher.Assemble(set, publisher.Infra{Store: st, Publisher: d.Publisher, Log: d.Log, Metrics: d.Metrics})
	if err != nil {
		return err
	}
	ln, err := service.Listen(cfg.Port)
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln, a.Lifecycle())
}
