package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/ssrf"
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
	ocfg, err := obs.ConfigFromEnv(getenv, "resulthandler")
	if err != nil {
		return err
	}
	log := ocfg.Logger(stdout)
	bg := context.WithoutCancel(ctx) // clients outlive ctx: they are needed while shutting down
	shutdownTelemetry, err := obs.Setup(bg, ocfg)
	if err != nil {
		return err
	}
	fs, err := firestore.NewClient(bg, cfg.Project)
	if err != nil {
		return fmt.Errorf("firestore: %w", err)
	}
	defer fs.Close()
	ps, err := pubsub.NewClient(bg, cfg.Project)
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
	h, err := resulthandler.New(st, st, pub, ssrf.NewClient(cfg.SSRF()), log, cfg.Policy, resulthandler.WithMetrics(metrics))
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	checks := []obs.Check{{Name: "firestore", Probe: st.Ping}}
	var pulling obs.Running
	if cfg.Consumer == resulthandler.ConsumerPull {
		checks = append(checks, pulling.Check("pull"))
	}
	mux.Handle("GET /readyz", obs.Ready(readyTimeout, checks...))
	if cfg.Consumer == resulthandler.ConsumerPush {
		// Cloud Run authenticates Pub/Sub's OIDC token (the service admits only the push
		// service account, with the push audience) before a request reaches this handler.
		mux.Handle("POST "+resulthandler.PushPath, bus.Push(h, log))
	}
	ln, err := net.Listen("tcp", ":"+cfg.Port)
	if err != nil {
		return fmt.Errorf("%s: %w", resulthandler.EnvPort, err)
	}
	srv := &http.Server{Handler: obs.Handler(mux, "resulthandler"), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	pullCtx, stopPull := context.WithCancel(bg)
	defer stopPull()
	pulled := make(chan error, 1)
	if cfg.Consumer == resulthandler.ConsumerPull {
		pulling.Set(true, "")
		go func() {
			pulled <- bus.Pull(pullCtx, ps, cfg.Subscription, bus.PullSettings{
				MaxOutstandingMessages: cfg.Concurrency,
				// A message is held while its chain of deliveries runs: a few POSTs at most.
				MaxExtension: 10 * cfg.LeaseTTL(),
			}, h)
		}()
	}
	log.InfoContext(ctx, "resulthandler started", "addr", ln.Addr().String(), "consumer", cfg.Consumer,
		"instance", cfg.Instance, "insecure_callbacks", cfg.AllowInsecure)

	var runErr error
	pullEnded := cfg.Consumer != resulthandler.ConsumerPull
	select {
	case <-ctx.Done():
	case err := <-served:
		runErr = fmt.Errorf("serve: %w", err)
	case runErr = <-pulled:
		pullEnded = true
	}
	pulling.Set(false, "shutting down")
	log.InfoContext(bg, "shutting down", "grace", cfg.ShutdownGrace.String())
	sctx, cancel := context.WithTimeout(bg, cfg.ShutdownGrace)
	defer cancel()
	stopPull()
	if !pullEnded {
		runErr = errors.Join(runErr, <-pulled) // in-flight deliveries have been recorded
	}
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		runErr = errors.Join(runErr, err)
	}
	return errors.Join(runErr, pub.Close(), shutdownTelemetry(sctx))
}
