// Package service owns what every genbox service process shares around its own wiring (STYLE §1,
// §5): the signal-driven main, the clients and telemetry opened at start, and the HTTP server's
// lifecycle — serve, run a pull consumer and background jobs beside it, and on SIGTERM stop
// pulling, abort what cannot finish, drain the server and flush the publisher and telemetry within
// the grace Cloud Run allows.
//
// A service's main.go is one line, service.Main("worker", run); its run(ctx, getenv, stdout)
// reads its own Config, calls Open and Deps.OpenStore, assembles the service, whose assembly says
// what runs as a Lifecycle, and ends in Deps.ListenAndServe. Tests call the same run on :0
// against the emulators; the dev stack runs the same Lifecycles with Run, over the clients it
// shares between the services.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/store"
)

// RunFunc is a service's run: it serves until ctx ends and returns why it stopped.
type RunFunc func(ctx context.Context, getenv func(string) string, stdout io.Writer) error

// Main calls run with a context that SIGINT and SIGTERM cancel, the process environment and
// stdout; when run fails it prints "name: error" on stderr and exits 1.
func Main(name string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Deps are what every service opens at start: its logger and telemetry, the project's Firestore
// and Pub/Sub clients, a bus publisher over the latter and the metric instruments.
type Deps struct {
	Log       *slog.Logger
	Firestore *firestore.Client
	PubSub    *pubsub.Client
	Publisher *bus.Publisher
	Metrics   *obs.Metrics

	name      string
	telemetry func(context.Context) error
	closeBox  func() error // OpenStore's secret box, when it opened one
	closeOnce sync.Once
	closeErr  error
}

// Open reads the telemetry configuration (obs.ConfigFromEnv, name being the default service name),
// sets up logging and telemetry and opens the clients of project. The clients outlive ctx (they
// are needed while shutting down); Serve, or Close, releases them.
func Open(ctx context.Context, name, project string, getenv func(string) string, stdout io.Writer) (*Deps, error) {
	ocfg, err := obs.ConfigFromEnv(getenv, name)
	if err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	d := &Deps{name: name, Log: ocfg.Logger(stdout)}
	if d.telemetry, err = obs.Setup(bg, ocfg); err != nil {
		return nil, err
	}
	if d.Metrics, err = obs.NewMetrics(otel.GetMeterProvider()); err != nil {
		return nil, errors.Join(err, d.telemetry(ctx))
	}
	if d.Firestore, err = firestore.NewClient(bg, project); err != nil {
		return nil, errors.Join(fmt.Errorf("firestore: %w", err), d.telemetry(ctx))
	}
	if d.PubSub, err = pubsub.NewClient(bg, project); err != nil {
		_ = d.Firestore.Close()
		return nil, errors.Join(fmt.Errorf("pubsub: %w", err), d.telemetry(ctx))
	}
	d.Publisher = bus.NewPublisher(d.PubSub)
	return d, nil
}

// Close flushes the publisher, then telemetry within ctx, and closes the clients, returning the
// flush errors. Only the first call does anything, so a run may defer it for its early returns.
func (d *Deps) Close(ctx context.Context) error {
	d.closeOnce.Do(func() {
		d.closeErr = errors.Join(d.Publisher.Close(), d.telemetry(ctx))
		// Closing a client or the box only releases connections: nothing to report.
		if d.closeBox != nil {
			_ = d.closeBox()
		}
		_ = d.PubSub.Close()
		_ = d.Firestore.Close()
	})
	return d.closeErr
}

// OpenStore returns the service's store over its Firestore client, sweeping shards shards. With a
// secretsKey (secretbox.EnvKey) the store seals and opens the tenants' webhook secrets, with a box
// Close releases; "" opens none, for a service that handles no secret.
func (d *Deps) OpenStore(ctx context.Context, shards int, secretsKey string) (*store.Store, error) {
	st := store.New(d.Firestore)
	st.Shards = shards
	if secretsKey == "" {
		return st, nil
	}
	box, closeBox, err := secretbox.FromKey(ctx, secretsKey)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", secretbox.EnvKey, err)
	}
	st.Secrets, d.closeBox = box, closeBox
	return st, nil
}

// Listen listens on port of every interface (0: a free one); the error names PORT.
func Listen(port int) (net.Listener, error) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("PORT: %w", err)
	}
	return ln, nil
}

// ReadyTimeout bounds a readiness probe: each check of GET /readyz.
const ReadyTimeout = 2 * time.Second

// Lifecycle is what Serve runs: a service as its assembly describes it.
type Lifecycle struct {
	// Handler is the service's routes (nil: none); Serve answers GET /healthz and GET /readyz
	// beside them and wraps them in obs.Handler under the service's name, or obs.PublicHandler
	// when Public.
	Handler http.Handler
	// Ready are the checks of GET /readyz; a pull consumer's running is checked too ("pull").
	Ready []obs.Check
	// Public says the internet calls the service: its callers' trace headers are linked, not
	// continued, and their baggage dropped.
	Public bool
	// Grace is how long the shutdown waits for the pull consumer's in-flight work before Abort;
	// the server's drain and the flushes get what is left of it, and at least minDrain. What
	// follows an Abort (the aborted work's lease releases, the background jobs' last flush, then
	// minDrain) comes on top, so Grace must leave the platform's kill that much room.
	Grace time.Duration
	// Pull, when set, runs beside the server (a pull consumer) until shutdown cancels its
	// context; readiness checks it runs, from its start to the start of the shutdown.
	Pull func(ctx context.Context) error
	// Abort, when set, is called if Pull has not returned Grace after shutdown began: its
	// in-flight work gives up (the worker's model calls release their lease) so Pull returns.
	Abort func()
	// Background jobs run beside the server from the start until shutdown, which cancels their
	// context once Pull has returned (they see its in-flight work through) and waits for them.
	Background []func(ctx context.Context)
	// Started is logged once serving, after the address.
	Started []any
	// Limits bound what one client can hold of the server; zero fields take DefaultLimits'.
	Limits Limits
}

// Limits bound what one client can hold of an HTTP server: a connection that dribbles its
// request, never reads its answer or idles open, and a header block past MaxHeaderBytes (431).
type Limits struct {
	ReadHeaderTimeout time.Duration // request headers (slowloris)
	ReadTimeout       time.Duration // the whole request, body included
	// WriteTimeout runs from the end of the request headers to the end of the answer: it must
	// exceed the slowest handler (a push delivery: the claim, the POST and the commit).
	WriteTimeout   time.Duration
	IdleTimeout    time.Duration // a keep-alive connection between requests
	MaxHeaderBytes int
	// Streaming says the server has routes that stream their answer (server-sent events): it
	// has no WriteTimeout, and each streaming handler bounds its own writes
	// (http.ResponseController.SetWriteDeadline per event). The other timeouts still hold.
	Streaming bool
}

// DefaultLimits are every genbox server's limits unless its Lifecycle says otherwise.
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// NewServer returns a server of h under l, its zero fields taking DefaultLimits'. Every genbox
// HTTP server is made here.
func NewServer(h http.Handler, l Limits) *http.Server {
	def := DefaultLimits()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cmp.Or(l.ReadHeaderTimeout, def.ReadHeaderTimeout),
		ReadTimeout:       cmp.Or(l.ReadTimeout, def.ReadTimeout),
		WriteTimeout:      cmp.Or(l.WriteTimeout, def.WriteTimeout),
		IdleTimeout:       cmp.Or(l.IdleTimeout, def.IdleTimeout),
		MaxHeaderBytes:    cmp.Or(l.MaxHeaderBytes, def.MaxHeaderBytes),
	}
	if l.Streaming {
		srv.WriteTimeout = 0
	}
	return srv
}

// minDrain is the least the server's drain and the flushes get after Pull returns, so that a
// Pull whose in-flight work used the whole grace still flushes.
const minDrain = time.Second

// Serve runs l as service d (Run), then closes d within what is left of l.Grace.
func (d *Deps) Serve(ctx context.Context, ln net.Listener, l Lifecycle) error {
	return Run(ctx, ln, d.name, d.Log, l, d.Close)
}

// ListenAndServe serves l as Serve does on port of every interface (Listen): a service's run ends
// in it, while a test that needs the address first calls Listen and Serve itself.
func (d *Deps) ListenAndServe(ctx context.Context, port int, l Lifecycle) error {
	ln, err := Listen(port)
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln, l)
}

// Run serves l.Handler, /healthz and /readyz on ln and runs l.Pull and l.Background until ctx
// ends, the server fails or Pull returns. Then it cancels Pull and waits for it (its in-flight
// work is recorded, or aborted by l.Abort once l.Grace has passed), stops the background jobs,
// shuts the server down and, when set, calls flush within what is left of l.Grace (at least
// minDrain), and returns every error joined.
func Run(ctx context.Context, ln net.Listener, name string, log *slog.Logger, l Lifecycle, flush func(context.Context) error) error {
	bg := context.WithoutCancel(ctx)
	var pulling *obs.Running
	ready := l.Ready
	if l.Pull != nil {
		pulling = new(obs.Running)
		ready = append(slices.Clip(ready), pulling.Check("pull"))
	}
	srv := NewServer(routes(name, log, l, ready), l.Limits)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	jobsCtx, stopJobs := context.WithCancel(bg)
	var jobs sync.WaitGroup
	for _, job := range l.Background {
		jobs.Go(func() { job(jobsCtx) })
	}
	pullCtx, stopPull := context.WithCancel(bg)
	defer stopPull()
	pulled := make(chan error, 1)
	if l.Pull != nil {
		pulling.Set(true, "")
		go func() { pulled <- l.Pull(pullCtx) }()
	}
	log.InfoContext(ctx, name+" started", append([]any{"addr", ln.Addr().String()}, l.Started...)...)

	var runErr error
	pullEnded := l.Pull == nil
	select {
	case <-ctx.Done():
	case err := <-served:
		runErr = fmt.Errorf("serve: %w", err)
	case runErr = <-pulled:
		pullEnded = true
	}
	if pulling != nil {
		pulling.Set(false, "shutting down")
	}
	log.InfoContext(bg, "shutting down", "grace", l.Grace.String())
	deadline := time.Now().Add(l.Grace)
	stopPull()
	if !pullEnded {
		var abort *time.Timer
		if l.Abort != nil {
			abort = time.AfterFunc(l.Grace, l.Abort)
		}
		runErr = errors.Join(runErr, <-pulled) // in-flight messages have been handled or aborted
		if abort != nil {
			abort.Stop()
		}
	}
	stopJobs()
	jobs.Wait()
	sctx, cancel := context.WithTimeout(bg, max(time.Until(deadline), minDrain))
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		runErr = errors.Join(runErr, err)
	}
	if flush != nil {
		runErr = errors.Join(runErr, flush(sctx))
	}
	return runErr
}

// routes are l.Handler's beside the probes, traced as service name.
func routes(name string, log *slog.Logger, l Lifecycle, ready []obs.Check) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", obs.Live())
	mux.Handle("GET /readyz", obs.Ready(log, ReadyTimeout, ready...))
	if l.Handler != nil {
		mux.Handle("/", l.Handler)
	}
	if l.Public {
		return obs.PublicHandler(mux, name)
	}
	return obs.Handler(mux, name)
}
