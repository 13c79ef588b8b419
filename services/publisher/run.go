package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
)

// shutdownBudget bounds the drain after SIGTERM, inside Cloud Run's 10 s grace.
const shutdownBudget = 8 * time.Second

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

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
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", obs.Ready(d.Log, readyTimeout, obs.Check{Name: "firestore", Probe: st.Ping}))
	mux.Handle("/", a.Server)
	ln, err := service.Listen(strconv.Itoa(cfg.Port))
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln, service.Lifecycle{Handler: mux, Public: true, Grace: shutdownBudget, Background: a.Background,
		Started: []any{"project", cfg.ProjectID, "admin", cfg.AdminKey != ""}})
}
