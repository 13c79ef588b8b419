package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
)

// readyTimeout bounds a readiness probe's Firestore read.
const readyTimeout = 2 * time.Second

// run serves /healthz (and the push endpoint in push mode, or pulls in pull mode) until ctx
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
	st := store.New(d.Firestore)
	box, closeBox, err := secretbox.FromKey(ctx, cfg.SecretsKey)
	if err != nil {
		return fmt.Errorf("%s: %w", secretbox.EnvKey, err)
	}
	defer func() { _ = closeBox() }()
	st.Secrets = box
	a, err := resulthandler.Assemble(cfg, resulthandler.Infra{Store: st, Publisher: d.Publisher, Log: d.Log, Metrics: d.Metrics})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	checks := []obs.Check{{Name: "firestore", Probe: st.Ping}}
	l := service.Lifecycle{Handler: mux, Grace: cfg.ShutdownGrace,
		Started: []any{"consumer", cfg.Consumer, "instance", cfg.Instance, "insecure_callbacks", cfg.AllowInsecure},
		// A push request lasts as long as its delivery: the claim, the POST and the commit.
		Limits: service.Limits{WriteTimeout: max(service.DefaultLimits().WriteTimeout, cfg.LeaseTTL())}}
	if cfg.Consumer == resulthandler.ConsumerPull {
		l.Pulling = new(obs.Running)
		checks = append(checks, l.Pulling.Check("pull"))
		l.Pull = func(ctx context.Context) error { return bus.Pull(ctx, d.PubSub, a.Subscription, a.Pull, a.Handler) }
	}
	mux.Handle("GET /readyz", obs.Ready(d.Log, readyTimeout, checks...))
	if cfg.Consumer == resulthandler.ConsumerPush {
		// Cloud Run authenticates Pub/Sub's OIDC token (the service admits only the push
		// service account, with the push audience) before a request reaches this handler,
		// which checks it again when GENBOX_PUSH_AUDIENCE and GENBOX_PUSH_SERVICE_ACCOUNT are set.
		mux.Handle("POST "+resulthandler.PushPath, resulthandler.PushHandler(a.Handler, cfg, d.Log))
	}
	ln, err := service.Listen(cfg.Port)
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln, l)
}
