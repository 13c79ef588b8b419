// Package devstack runs the whole genbox stack in one process: the official emulators (started,
// or reused when FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST name running ones), the Pub/Sub
// topology, the four services wired from their internal packages (publisher over HTTP; worker
// with its sweeper, resulthandler and dlqnotifier consuming by pull), the fake Gemini unless a
// real backend is configured, Cloud Storage (fake-gcs-server, in-process), a Slack double with its console page, and a verifying webhook
// listener for the dev tenant. It is `genbox dev`, and the stack of the end-to-end tests and of
// the benchmarks. Local (loopback, http) callbacks are allowed here, and only here.
package devstack

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/console"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/objects/gcsfake"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/worker"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// Environment variables `genbox dev` reads itself; every service variable passes through to the
// services (e.g. GENBOX_RETRY_BASE), except those the stack sets (see Config.ServiceEnv).
const (
	EnvProject       = "GOOGLE_CLOUD_PROJECT"
	EnvAPIKey        = "GENBOX_DEV_API_KEY"
	EnvWebhookSecret = "GENBOX_DEV_WEBHOOK_SECRET"
	EnvAdminKey      = "GENBOX_ADMIN_KEY"
	EnvSigningSecret = "SLACK_SIGNING_SECRET"
	EnvApprovers     = "GENBOX_SLACK_APPROVERS"
	EnvSlackChannel  = "GENBOX_SLACK_CHANNEL"
	EnvGeminiAPIKey  = "GEMINI_API_KEY"
	EnvGeminiBackend = "GENBOX_GEMINI_BACKEND"
)

// Defaults of the dev stack.
const (
	DefaultProject  = "genbox-dev"
	DefaultAddr     = "127.0.0.1:8080"
	DefaultApprover = "UDEVAPPROVER"
	DefaultChannel  = "#genbox-dev"
	DevTenant       = "dev"
	DevOperator     = "dev"
	WebhookPath     = "/webhook"
	slackBotToken   = "xoxb-genbox-dev-double"
)

// DevInputBucket is the input bucket of the in-process storage emulator.
const DevInputBucket = "genbox-dev-input"

// The stack's services (and the worker's sweeper), as Config.WrapPublisher and
// Config.WrapHandler name them.
const (
	ServicePublisher     = "publisher"
	ServiceWorker        = "worker"
	ServiceSweeper       = "sweeper"
	ServiceResultHandler = "resulthandler"
	ServiceDLQNotifier   = "dlqnotifier"
)

// ErrConfig means a setting is invalid; the message names the variable or flag.
var ErrConfig = errors.New("devstack: invalid configuration")

// Publisher publishes a message: what every service takes, and *bus.Publisher implements.
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

var _ Publisher = (*bus.Publisher)(nil)

// Config is the dev stack's configuration.
type Config struct {
	Project string // GOOGLE_CLOUD_PROJECT, default genbox-dev

	// Listen addresses ("127.0.0.1:0" picks a free port).
	PublisherAddr string // --addr, default 127.0.0.1:8080
	DLQAddr       string // the dlqnotifier's HTTP (interactions, admin routes)
	SlackAddr     string // the Slack double and its console
	WebhookAddr   string // the dev tenant's webhook listener
	GeminiAddr    string // the fake Gemini

	APIKey        string // GENBOX_DEV_API_KEY: the dev tenant's API key; generated when empty
	WebhookSecret string // GENBOX_DEV_WEBHOOK_SECRET: the dev tenant's whsec_ secret; generated when empty
	AdminKey      string // GENBOX_ADMIN_KEY: the admin routes' key; generated when empty
	SigningSecret string // SLACK_SIGNING_SECRET; generated when empty
	// SecretsKey seals the tenants' webhook secrets in Firestore (GENBOX_WEBHOOK_SECRETS_KEY):
	// a local key generated when empty, as the emulators' data lasts one run.
	SecretsKey string
	Approvers  []string // GENBOX_SLACK_APPROVERS; the console clicks as the first
	// RealGemini is set when GEMINI_API_KEY (or GENBOX_GEMINI_BACKEND=vertex) is: no fake then.
	RealGemini bool

	// Getenv is the services' environment, read through ServiceEnv (os.Getenv when nil).
	Getenv func(string) string
	// Log receives every service's log; discarded when nil.
	Log *slog.Logger
	// Metrics receives every service's metrics (obs.NewMetrics); nil records none. Spans go to
	// the global tracer provider, as in the services.
	Metrics *obs.Metrics
	// Out receives what the webhook listener prints (each verified delivery); discarded when nil.
	Out io.Writer
	// Emulators says where to find the emulators when they must be started.
	Emulators emulator.Options
	// Topology is the Pub/Sub topology bootstrapped (bus.DefaultTopology when zero).
	Topology bus.Topology
	// Fake configures the fake Gemini (latency, failures).
	Fake []geminitest.Option
	// Workers is how many worker instances run, each its own GENBOX_INSTANCE_ID (the variable's
	// value, suffixed -2, -3, … after the first) on the same subscription (0 is one).
	Workers int

	// The hooks below let a harness (internal/bench) measure and perturb the stack `genbox dev`
	// runs without assembling the services itself; nil leaves the stack as it is.

	// OpenFirestore opens the stack's Firestore client on the emulator at host (e.g. one whose
	// operations fscount counts); nil: firestore.NewClient.
	OpenFirestore func(ctx context.Context, host, project string) (*firestore.Client, error)
	// WrapPublisher wraps the publisher that service (ServiceWorker, ...) publishes through.
	WrapPublisher func(service string, p Publisher) Publisher
	// WrapHandler wraps the message handler of a pull consumer (ServiceWorker,
	// ServiceResultHandler).
	WrapHandler func(service string, h bus.Handler) bus.Handler

	generated []string // names of the secrets generated by withDefaults, to be printed
}

// FromEnv reads the configuration `genbox dev` takes from the environment; addresses default to
// fixed loopback ports so scripts and the README can name them.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Project:       getenv(EnvProject),
		PublisherAddr: DefaultAddr,
		DLQAddr:       "127.0.0.1:8081",
		SlackAddr:     "127.0.0.1:8082",
		WebhookAddr:   "127.0.0.1:8083",
		GeminiAddr:    "127.0.0.1:8084",
		APIKey:        getenv(EnvAPIKey),
		WebhookSecret: getenv(EnvWebhookSecret),
		AdminKey:      getenv(EnvAdminKey),
		SigningSecret: getenv(EnvSigningSecret),
		SecretsKey:    getenv(secretbox.EnvKey),
		RealGemini:    getenv(EnvGeminiAPIKey) != "" || getenv(EnvGeminiBackend) == gemini.BackendVertex,
		Getenv:        getenv,
	}
	for _, a := range strings.Split(getenv(EnvApprovers), ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.Approvers = append(c.Approvers, a)
		}
	}
	return c, c.Validate()
}

// Validate reports every setting that cannot work, naming its variable.
func (c Config) Validate() error {
	var errs []error
	if c.WebhookSecret != "" {
		if _, err := webhook.ParseSecret(c.WebhookSecret); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w (generate one with `genbox webhook listen`, or leave it unset)", ErrConfig, EnvWebhookSecret, err))
		}
	}
	if c.SecretsKey != "" {
		if err := secretbox.CheckKey(c.SecretsKey); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w", ErrConfig, secretbox.EnvKey, err))
		}
	}
	if c.AdminKey != "" && len(c.AdminKey) < 16 {
		errs = append(errs, fmt.Errorf("%w: %s must be at least 16 characters", ErrConfig, EnvAdminKey))
	}
	if c.APIKey != "" && len(c.APIKey) < 16 {
		errs = append(errs, fmt.Errorf("%w: %s must be at least 16 characters", ErrConfig, EnvAPIKey))
	}
	for name, addr := range map[string]string{"publisher": c.PublisherAddr, "dlqnotifier": c.DLQAddr,
		"slack": c.SlackAddr, "webhook": c.WebhookAddr, "gemini": c.GeminiAddr} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s address %q: %w", ErrConfig, name, addr, err))
		}
	}
	return errors.Join(errs...)
}

// withDefaults fills in the project and generates the secrets left empty.
func (c Config) withDefaults() (Config, error) {
	if c.Project == "" {
		c.Project = DefaultProject
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if len(c.Approvers) == 0 {
		c.Approvers = []string{DefaultApprover}
	}
	if c.Topology.AckDeadline == 0 {
		c.Topology = bus.DefaultTopology()
	}
	gen := func(name string, dst *string, mk func() (string, error)) error {
		if *dst != "" {
			return nil
		}
		v, err := mk()
		if err != nil {
			return fmt.Errorf("generate %s: %w", name, err)
		}
		*dst = v
		c.generated = append(c.generated, name)
		return nil
	}
	return c, errors.Join(
		gen(EnvAPIKey, &c.APIKey, func() (string, error) { return randomKey("gbx_dev_") }),
		gen(EnvWebhookSecret, &c.WebhookSecret, webhook.NewSecret),
		gen(EnvAdminKey, &c.AdminKey, func() (string, error) { return randomKey("gbx_admin_") }),
		gen(EnvSigningSecret, &c.SigningSecret, func() (string, error) { return randomKey("") }),
		gen(secretbox.EnvKey, &c.SecretsKey, secretbox.NewLocalKey),
	)
}

func randomKey(prefix string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// ServiceEnv is the environment the in-process services read: c.Getenv, except for what the dev
// stack decides — the project, the admin key, pull consumers, local callbacks allowed, the Slack
// double and its secrets, and the fake Gemini's URL (when faked).
func (c Config) ServiceEnv(fakeGeminiURL, slackAPIURL string) func(string) string {
	forced := map[string]string{
		EnvProject:                        c.Project,
		EnvAdminKey:                       c.AdminKey,
		secretbox.EnvKey:                  c.SecretsKey,
		"GENBOX_CONSUMER":                 resulthandler.ConsumerPull,
		"GENBOX_ALLOW_INSECURE_CALLBACKS": "true",
		EnvSigningSecret:                  c.SigningSecret,
		EnvApprovers:                      strings.Join(c.Approvers, ","),
		"SLACK_BOT_TOKEN":                 slackBotToken,
		"GENBOX_SLACK_API_URL":            slackAPIURL,
		"PORT":                            "0",
	}
	if fakeGeminiURL != "" {
		forced["GOOGLE_GEMINI_BASE_URL"] = fakeGeminiURL
	}
	forced[objects.EnvInputBucket] = DevInputBucket
	if c.Getenv(EnvSlackChannel) == "" {
		forced[EnvSlackChannel] = DefaultChannel
	}
	return func(name string) string {
		if v, ok := forced[name]; ok {
			return v
		}
		return c.Getenv(name)
	}
}

// Info is what the stack serves and how to reach it: what `genbox dev` prints and writes to
// --ready-file.
type Info struct {
	Publisher         string `json:"publisher"`
	SlackInteractions string `json:"slack_interactions"`
	SlackConsole      string `json:"slack_console"`
	WebhookListener   string `json:"webhook_listener"`
	FakeGemini        string `json:"fake_gemini"` // empty with a real model backend
	DLQ               string `json:"dlq"`         // the dlqnotifier's base URL (admin routes: GENBOX_DLQ_URL)
	// Console is the operators' console; the URL logs a browser in once (a one-time token).
	Console       string `json:"console"`
	APIKey        string `json:"api_key"`
	AdminKey      string `json:"admin_key"`
	WebhookURL    string `json:"webhook_url"` // the callback_url that reaches the listener
	Project       string `json:"project"`
	FirestoreHost string `json:"firestore_emulator_host"`
	PubSubHost    string `json:"pubsub_emulator_host"`
	// StorageHost is the in-process Cloud Storage emulator (STORAGE_EMULATOR_HOST reaches it);
	// uploads go to its bucket DevInputBucket.
	StorageHost  string `json:"storage_emulator_host"`
	ModelBackend string `json:"model_backend"`
	// Generated names the secrets the stack generated because their variable was unset.
	Generated []string `json:"generated,omitempty"`
	// EmulatorsStarted is true when the stack started the emulators (and stops them on Close).
	EmulatorsStarted bool `json:"emulators_started"`
}

// Stack is a running dev stack.
type Stack struct {
	Info  Info
	Store *store.Store
	// Fake is the fake Gemini (nil with a real backend).
	Fake  *geminitest.Fake
	Slack *Slack
	// Inbox is the dev tenant's webhook listener: it prints every delivery as `genbox webhook
	// listen` does and records it, so tests and scripts can wait for one.
	Inbox *doubles.Receiver
	// Worker is the worker's message handler.
	Worker *worker.Handler
	// Storage is the in-process Cloud Storage emulator; Objects its client, the services'.
	Storage *gcsfake.Server
	Objects *objects.Client

	cfg    Config
	log    *slog.Logger
	emu    *emulator.Emulators
	fs     *firestore.Client
	ps     *pubsub.Client
	pub    *bus.Publisher
	stopMu sync.Mutex
	stops  []func(context.Context) error // run in reverse order by Close
	// services is the index in stops of the first service's stop (see StopServices).
	services int
	failed   chan error
	closed   bool
}

// Failed delivers the first error of a component that stopped on its own (a server or a pull
// consumer); the stack should then be closed.
func (s *Stack) Failed() <-chan error { return s.failed }

func (s *Stack) fail(err error) {
	select {
	case s.failed <- err:
	default:
	}
}

func (s *Stack) onClose(f func(context.Context) error) {
	s.stopMu.Lock()
	s.stops = append(s.stops, f)
	s.stopMu.Unlock()
}

// Start brings the stack up; Close it (also when Start fails, it has cleaned up after itself).
func Start(ctx context.Context, cfg Config) (st *Stack, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Stack{cfg: cfg, log: cfg.Log, failed: make(chan error, 1)}
	defer func() {
		if err != nil {
			_ = s.Close(context.WithoutCancel(ctx))
		}
	}()
	eo := cfg.Emulators
	if eo.Getenv == nil {
		eo.Getenv = cfg.Getenv
	}
	s.emu, err = emulator.Start(ctx, eo)
	if err != nil {
		return nil, err
	}
	if err := s.emu.Setenv(); err != nil {
		return nil, err
	}
	s.Info = Info{Project: cfg.Project, APIKey: cfg.APIKey, AdminKey: cfg.AdminKey, Generated: cfg.generated,
		FirestoreHost: s.emu.FirestoreHost, PubSubHost: s.emu.PubSubHost, EmulatorsStarted: s.emu.Started()}

	bg := context.WithoutCancel(ctx) // the clients outlive ctx: they are needed while shutting down
	open := cfg.OpenFirestore
	if open == nil {
		open = func(ctx context.Context, _, project string) (*firestore.Client, error) {
			return firestore.NewClient(ctx, project)
		}
	}
	if s.fs, err = open(bg, s.emu.FirestoreHost, cfg.Project); err != nil {
		return nil, fmt.Errorf("firestore: %w", err)
	}
	if s.ps, err = pubsub.NewClient(bg, cfg.Project); err != nil {
		return nil, fmt.Errorf("pubsub: %w", err)
	}
	if err := bus.Bootstrap(ctx, s.ps, cfg.Topology); err != nil {
		return nil, fmt.Errorf("bootstrap pub/sub: %w", err)
	}
	s.pub = bus.NewPublisher(s.ps)
	s.Store = store.New(s.fs)
	box, closeBox, err := secretbox.FromKey(bg, cfg.SecretsKey)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", secretbox.EnvKey, err)
	}
	s.onClose(func(context.Context) error { return closeBox() })
	s.Store.Secrets = box

	fakeURL := ""
	if cfg.RealGemini {
		s.Info.ModelBackend = "Gemini API (GEMINI_API_KEY)"
		if cfg.Getenv(EnvGeminiBackend) == gemini.BackendVertex {
			s.Info.ModelBackend = "Vertex AI (GENBOX_GEMINI_BACKEND=vertex)"
		}
	} else {
		s.Fake = geminitest.New(append([]geminitest.Option{geminitest.WithLogger(s.log.With("service", "fakegemini"))}, cfg.Fake...)...)
		ln, err := s.serve(cfg.GeminiAddr, "fake gemini", s.Fake)
		if err != nil {
			return nil, err
		}
		s.onClose(func(context.Context) error { s.Fake.Close(); return nil })
		fakeURL = "http://" + ln
		s.Info.FakeGemini = fakeURL
		s.Info.ModelBackend = "fake Gemini at " + fakeURL + " (set GEMINI_API_KEY to call the Gemini API)"
	}

	if s.Storage, err = gcsfake.Start(DevInputBucket); err != nil {
		return nil, err
	}
	s.onClose(func(context.Context) error { s.Storage.Close(); return nil })
	if s.Objects, err = s.Storage.Client(bg); err != nil {
		return nil, err
	}
	s.onClose(func(context.Context) error { return s.Objects.Close() })
	s.Info.StorageHost = s.Storage.Host()

	v, err := webhook.NewVerifier(cfg.WebhookSecret)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvWebhookSecret, err)
	}
	// pkg/webhook's Receiver answers and prints every delivery, as `genbox webhook listen` does.
	s.Inbox = doubles.New(cfg.WebhookSecret)
	s.Inbox.Respond = webhook.Receiver(v, cfg.Out)
	ln, err := s.serve(cfg.WebhookAddr, "webhook listener", s.Inbox)
	if err != nil {
		return nil, err
	}
	s.Info.WebhookListener = "http://" + ln
	s.Info.WebhookURL = s.Info.WebhookListener + WebhookPath

	// The dlqnotifier's address is needed by the Slack double's console before the service runs.
	dlqLn, err := net.Listen("tcp", cfg.DLQAddr)
	if err != nil {
		return nil, fmt.Errorf("dlqnotifier: listen on %s: %w (choose another address)", cfg.DLQAddr, err)
	}
	s.onClose(func(context.Context) error { _ = dlqLn.Close(); return nil }) // if Start fails before it is served
	s.Info.DLQ = "http://" + dlqLn.Addr().String()
	s.Info.SlackInteractions = s.Info.DLQ + dlqnotifier.InteractionsPath
	sign := func(ts time.Time, body []byte) http.Header {
		return dlqnotifier.SignSlackRequest(cfg.SigningSecret, ts, body)
	}
	s.Slack = &Slack{Slack: &doubles.Slack{Log: s.log.With("service", "slack")},
		Interactions: s.Info.SlackInteractions, Sign: sign, Approver: cfg.Approvers[0], Store: s.Store}
	if ln, err = s.serve(cfg.SlackAddr, "slack double", s.Slack); err != nil {
		return nil, err
	}
	s.Info.SlackConsole = "http://" + ln + "/"
	env := cfg.ServiceEnv(fakeURL, "http://"+ln)

	if err := s.ensureTenant(ctx); err != nil {
		return nil, err
	}
	s.stopMu.Lock()
	s.services = len(s.stops)
	s.stopMu.Unlock()
	if s.Store.Shards, err = store.ShardsFromEnv(env); err != nil {
		return nil, err
	}
	if err := s.startPublisher(env); err != nil {
		return nil, err
	}
	for k := range max(cfg.Workers, 1) {
		if err := s.startWorker(ctx, instanceEnv(env, k)); err != nil {
			return nil, err
		}
	}
	if err := s.startResultHandler(env); err != nil {
		return nil, err
	}
	if err := s.startDLQNotifier(env, dlqLn); err != nil {
		return nil, err
	}
	return s, nil
}

// listen listens on addr for the part called name.
func listen(addr, name string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w (is another `genbox dev` running? choose another address)", name, addr, err)
	}
	return ln, nil
}

// serve serves h on addr until Close and returns the bound address.
func (s *Stack) serve(addr, name string, h http.Handler) (string, error) {
	ln, err := listen(addr, name)
	if err != nil {
		return "", err
	}
	srv := service.NewServer(h, service.Limits{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.fail(fmt.Errorf("%s: %w", name, err))
		}
	}()
	s.onClose(func(ctx context.Context) error {
		err := srv.Shutdown(ctx)
		<-done
		if err != nil {
			return fmt.Errorf("%s: shutdown: %w", name, err)
		}
		return nil
	})
	return ln.Addr().String(), nil
}

// ensureTenant creates the dev tenant with the configured API key and webhook secret, or, on
// reused emulators, makes the existing one sign with that secret and accept that key.
func (s *Stack) ensureTenant(ctx context.Context) error {
	_, err := s.Store.CreateTenant(ctx, DevTenant, store.DefaultLimits(), s.cfg.WebhookSecret)
	if errors.Is(err, store.ErrExists) {
		// Secrets an earlier run sealed under another key do not open: rotate to this run's.
		active, gerr := s.Store.WebhookSecrets(ctx, DevTenant)
		if gerr != nil || active[0] != s.cfg.WebhookSecret {
			// The dev listener verifies with this secret only: no overlap with earlier runs' secrets.
			_, err = s.Store.RotateWebhookSecret(ctx, DevTenant, s.cfg.WebhookSecret, 0)
		} else {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("dev tenant: %w", err)
	}
	_, err = s.Store.CreateAPIKey(ctx, DevTenant, s.cfg.APIKey)
	if errors.Is(err, store.ErrExists) {
		tenant, aerr := s.Store.Authenticate(ctx, s.cfg.APIKey)
		if aerr != nil || tenant != DevTenant {
			return fmt.Errorf("%s: the key exists but does not authenticate the dev tenant (%w): choose another key", EnvAPIKey, aerr)
		}
		err = nil
	}
	if err != nil {
		return fmt.Errorf("dev tenant API key: %w", err)
	}
	return nil
}

func (s *Stack) startPublisher(env func(string) string) error {
	set, err := publisher.Load(env)
	if err != nil {
		return err
	}
	a, err := publisher.Assemble(set, publisher.Infra{Store: s.Store, Publisher: s.publisher(ServicePublisher),
		Log: s.log.With("service", "publisher"), Metrics: s.cfg.Metrics, Objects: s.Objects})
	if err != nil {
		return err
	}
	ln, err := listen(s.cfg.PublisherAddr, "publisher")
	if err != nil {
		return fmt.Errorf("%w (--addr)", err)
	}
	s.run(ln, ServicePublisher, a.Lifecycle())
	s.Info.Publisher = "http://" + ln.Addr().String()
	return nil
}

// run runs l — a service's assembly, as its process runs it with service.Run — on ln until
// StopServices or Close; a service that stops on its own fails the stack.
func (s *Stack) run(ln net.Listener, name string, l service.Lifecycle) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = service.Run(ctx, ln, name, s.log.With("service", name), l, nil)
		if ctx.Err() == nil {
			s.fail(fmt.Errorf("%s stopped: %w", name, cmp.Or(err, errors.New("no error"))))
		}
	}()
	s.onClose(func(context.Context) error {
		cancel()
		<-done
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// handler is the message handler of service's pull consumer, wrapped by Config.WrapHandler.
func (s *Stack) handler(service string, h bus.Handler) bus.Handler {
	if s.cfg.WrapHandler == nil {
		return h
	}
	return s.cfg.WrapHandler(service, h)
}

// publisher is the publisher service publishes through.
func (s *Stack) publisher(service string) Publisher {
	if s.cfg.WrapPublisher == nil {
		return s.pub
	}
	return s.cfg.WrapPublisher(service, s.pub)
}

// instanceEnv is env for the worker instance k (from 0): the first keeps GENBOX_INSTANCE_ID as it
// is, the others suffix it (their own name when it is unset).
func instanceEnv(env func(string) string, k int) func(string) string {
	if k == 0 {
		return env
	}
	return func(name string) string {
		if name != "GENBOX_INSTANCE_ID" {
			return env(name)
		}
		return fmt.Sprintf("%s-%d", cmp.Or(env(name), "worker"), k+1)
	}
}

func (s *Stack) startWorker(ctx context.Context, env func(string) string) error {
	set, err := worker.Load(env)
	if err != nil {
		return err
	}
	a, err := worker.Assemble(ctx, set, worker.Infra{Store: s.Store, Publisher: s.publisher(ServiceWorker),
		SweeperPublisher: s.publisher(ServiceSweeper), Log: s.log.With("service", "worker"), Metrics: s.cfg.Metrics, Objects: s.Objects})
	if err != nil {
		return err
	}
	if s.Worker == nil {
		s.Worker = a.Handler
	}
	ln, err := listen("127.0.0.1:0", ServiceWorker) // its routes are only its probes
	if err != nil {
		return err
	}
	s.run(ln, ServiceWorker, a.Lifecycle(s.ps, s.handler(ServiceWorker, a.Handler)))
	return nil
}

func (s *Stack) startResultHandler(env func(string) string) error {
	cfg, err := resulthandler.FromEnv(env)
	if err != nil {
		return err
	}
	a, err := resulthandler.Assemble(cfg, resulthandler.Infra{Store: s.Store, Publisher: s.publisher(ServiceResultHandler),
		Log: s.log.With("service", "resulthandler"), Metrics: s.cfg.Metrics})
	if err != nil {
		return err
	}
	ln, err := listen("127.0.0.1:0", ServiceResultHandler)
	if err != nil {
		return err
	}
	s.run(ln, ServiceResultHandler, a.Lifecycle(s.ps, s.handler(ServiceResultHandler, a.Handler)))
	return nil
}

func (s *Stack) startDLQNotifier(env func(string) string, ln net.Listener) error {
	set, err := dlqnotifier.Load(env)
	if err != nil {
		return err
	}
	svc := dlqnotifier.Assemble(set, dlqnotifier.Infra{Store: s.Store, Publisher: s.publisher(ServiceDLQNotifier),
		Log: s.log.With("service", "dlqnotifier"), Metrics: s.cfg.Metrics})
	con, err := console.New(console.Config{AdminKey: s.cfg.AdminKey, ProxyHops: set.Config.ProxyHops}, console.Deps{Store: s.Store, Decider: svc, Estimator: svc,
		Pricing: set.Config.Pricing, Prompts: set.Prompts(), Log: s.log.With("service", "console")})
	if err != nil {
		return err
	}
	// The printed console URL logs the browser in once, as operator "dev".
	login, err := con.IssueLogin(context.Background(), DevOperator)
	if err != nil {
		return fmt.Errorf("console login: %w", err)
	}
	s.Info.Console = s.Info.DLQ + login
	s.run(ln, ServiceDLQNotifier, svc.Lifecycle(s.ps, map[string]http.Handler{console.Prefix: con}))
	return nil
}

// StopServices stops the services — their consumers, background loops and servers, as Close
// would — and leaves up what they talk to (the fake Gemini, the Slack double, the webhook
// listener, the emulators' clients), so that what those recorded can be read once no call can
// start any more: the fake's generations in flight still finish and are billed. Close stops the
// rest.
func (s *Stack) StopServices(ctx context.Context) error {
	s.stopMu.Lock()
	if s.closed {
		s.stopMu.Unlock()
		return nil
	}
	stops := s.stops[s.services:]
	s.stops = slices.Clip(s.stops[:s.services]) // a later append must not write over stops
	s.stopMu.Unlock()
	return runStops(ctx, stops)
}

// Close stops everything Start started, in reverse order — the services, the servers, the fake
// Gemini, and last the emulators it launched — within ctx's deadline.
func (s *Stack) Close(ctx context.Context) error {
	s.stopMu.Lock()
	if s.closed {
		s.stopMu.Unlock()
		return nil
	}
	s.closed = true
	stops := s.stops
	s.stopMu.Unlock()
	errs := []error{runStops(ctx, stops)}
	if s.pub != nil {
		errs = append(errs, s.pub.Close())
	}
	if s.ps != nil {
		errs = append(errs, s.ps.Close())
	}
	if s.fs != nil {
		errs = append(errs, s.fs.Close())
	}
	if s.emu != nil {
		s.emu.Stop()
	}
	return errors.Join(errs...)
}

// runStops runs stops in reverse order.
func runStops(ctx context.Context, stops []func(context.Context) error) error {
	var errs []error
	for i := len(stops) - 1; i >= 0; i-- {
		errs = append(errs, stops[i](ctx))
	}
	return errors.Join(errs...)
}
