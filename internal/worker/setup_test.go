package worker

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// fakeRenderer renders the task input as the prompt, for the model chain it is given.
type fakeRenderer struct {
	RenderFunc func(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error)
}

func (r fakeRenderer) Render(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error) {
	return r.RenderFunc(family, variant, input, cfg)
}

// chain renders every task for models.
func chain(models ...string) fakeRenderer {
	return fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{Prompt: input, Models: models}, nil
	}}
}

type bundle struct {
	project string
	fs      *firestore.Client
	store   *store.Store
	srv     *geminitest.Server
	gen     *gemini.Client
	pub     *testenv.Publisher
	logs    *testenv.LogBuffer
	log     *slog.Logger

	t   testing.TB
	mu  sync.Mutex
	tel map[*Handler]*obstest.Telemetry // each handler's own metrics
}

// setup returns a bundle on a project of the test's own, a fake Gemini with lat latency per call,
// and a Gemini client with quick retries.
func setup(t testing.TB, lat time.Duration) *bundle {
	t.Helper()
	return setupWith(t, lat, nil)
}

// setupWith is setup with extra Gemini client settings (variable -> value).
func setupWith(t testing.TB, lat time.Duration, extra map[string]string) *bundle {
	t.Helper()
	project := emulator.ProjectID(t)
	return setupOn(t, project, testenv.Firestore(t, project), lat, extra)
}

// setupFaulty is setup over a Firestore client whose unary calls meet fault first: a non-nil
// error answers a call in the emulator's place, and the call is not made.
func setupFaulty(t *testing.T, fault func(req any) error) *bundle {
	t.Helper()
	project := emulator.ProjectID(t)
	fs, err := emulator.FirestoreClient(context.Background(), os.Getenv(emulator.FirestoreHostEnv), project,
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if err := fault(req); err != nil {
				return err
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	return setupOn(t, project, fs, 0, nil)
}

// setupOn is setupWith over the Firestore client fs of project.
func setupOn(t testing.TB, project string, fs *firestore.Client, lat time.Duration, extra map[string]string, fakeOpts ...geminitest.Option) *bundle {
	t.Helper()
	ctx := context.Background()
	st := store.New(fs)
	st.MaxAttempts = 20
	srv := geminitest.NewServer(append([]geminitest.Option{geminitest.WithLatency("", geminitest.Fixed(lat))}, fakeOpts...)...)
	t.Cleanup(srv.Close)
	logs := &testenv.LogBuffer{}
	return &bundle{project: project, fs: fs, store: st, srv: srv, gen: geminiClient(ctx, t, srv.URL, extra), pub: &testenv.Publisher{}, logs: logs,
		log: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), t: t, tel: map[*Handler]*obstest.Telemetry{}}
}

// geminiClient is a Gemini client of the fake at url with quick retries and extra settings
// (variable -> value).
func geminiClient(ctx context.Context, t testing.TB, url string, extra map[string]string, opts ...gemini.Option) *gemini.Client {
	t.Helper()
	env := map[string]string{
		"GOOGLE_GEMINI_BASE_URL": url, "GENBOX_MODEL_CHAIN": "m",
		"GENBOX_MAX_ATTEMPTS": "2", "GENBOX_MODEL_ATTEMPTS": "2",
		"GENBOX_BACKOFF_BASE": "5ms", "GENBOX_BACKOFF_MAX": "10ms",
	}
	maps.Copy(env, extra)
	cfg, err := geminienv.Config(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	gen, err := gemini.New(ctx, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

// policy is a test policy: short leases, a long renewal unless set.
func policy(owner string) Policy {
	return Policy{
		Owner: owner, LeaseTTL: 5 * time.Second, RenewEvery: 100 * time.Millisecond,
		MaxAttempts: 3, ClaimCap: 2,
		RetryBase: time.Second, RetryMax: 2 * time.Second, ParkBase: time.Second, ParkMax: 2 * time.Second,
		NudgeGrace: time.Minute, CommitRetry: 5 * time.Second, DeliveryLease: protocol.DeliveryLease(2 * time.Second),
	}
}

// handler returns a handler of pol, opts applied, with metrics of its own (read them with count).
func (b *bundle) handler(pol Policy, r Renderer, opts ...Option) *Handler {
	tel := obstest.Metrics(b.t)
	h := New(b.store, b.gen, r, b.pub, b.log.With("owner", pol.Owner), pol, append(opts, WithMetrics(tel.Metrics))...)
	b.mu.Lock()
	b.tel[h] = tel
	b.mu.Unlock()
	return h
}

// count returns what h recorded in metric name on the points matching every "k=v" of match:
// the sum of a counter, the number of values of a histogram.
func (b *bundle) count(t *testing.T, h *Handler, name string, match ...string) int {
	t.Helper()
	b.mu.Lock()
	tel := b.tel[h]
	b.mu.Unlock()
	return int(tel.Sum(t, name, match...))
}

// outcomes returns how many times h counted outcome (obs.Worker*) in genbox.worker.outcomes.
func (b *bundle) outcomes(t *testing.T, h *Handler, outcome string) int {
	t.Helper()
	return b.count(t, h, obs.MetricWorkerOutcomes, obs.AttrOutcome+"="+outcome)
}

// task writes a queued task whose input names its id (so the fake's ledger can find its bills).
func (b *bundle) task(t testing.TB, id string, mutate ...func(*protocol.Task)) {
	t.Helper()
	doc := &protocol.Task{
		ID: id, Tenant: "tenant-a", Family: "summarize", Variant: "default", Input: "summarize " + id,
		State: task.StateQueued, CallbackURL: "https://app.example/hook",
	}
	for _, m := range mutate {
		m(doc)
	}
	if err := b.store.CreateTask(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) get(t *testing.T, id string) *protocol.Task {
	t.Helper()
	doc, err := b.store.GetTask(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func msg(id string) *bus.Message {
	return &bus.Message{ID: "m-" + id, Attributes: map[string]string{task.AttrTaskID: id}}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
