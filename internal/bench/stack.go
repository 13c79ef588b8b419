package bench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/fscount"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/internal/worker"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// The systems a run can put the workload through.
const (
	systemGenbox = "genbox"
	systemNaive  = "naive"
)

const (
	benchTenant = "bench"
	benchModel  = "bench-model"
)

// taskIDRE finds a bench task id in a prompt, so the fake knows which task a call is for.
var taskIDRE = regexp.MustCompile(`\bbt\d{6}\b`)

func taskID(i int) string { return fmt.Sprintf("bt%06d", i) }

// env is the services' environment in a bench run: genbox's production defaults, with the
// durations that only pace recovery (nudge grace, sweep interval, backoffs) shortened so a run
// takes seconds, and the fake Gemini as the model.
func env(project, fakeURL string, concurrency int) func(string) string {
	m := map[string]string{
		"GOOGLE_CLOUD_PROJECT":            project,
		"GOOGLE_GEMINI_BASE_URL":          fakeURL,
		"GENBOX_MODEL_CHAIN":              benchModel,
		"GENBOX_BACKOFF_BASE":             "20ms",
		"GENBOX_BACKOFF_MAX":              "200ms",
		"GENBOX_INSTANCE_ID":              "bench",
		"GENBOX_CONCURRENCY":              fmt.Sprint(2 * concurrency),
		"GENBOX_NUDGE_GRACE":              "1s",
		"GENBOX_RETRY_BASE":               "100ms",
		"GENBOX_RETRY_MAX":                "1s",
		"GENBOX_SWEEP_INTERVAL":           "250ms",
		"GENBOX_SWEEP_LEADER_TTL":         "2s",
		"GENBOX_SWEEP_BACKOFF_BASE":       "1s",
		"GENBOX_SWEEP_BACKOFF_MAX":        "2s",
		"GENBOX_SWEEP_PACE":               "2000",
		"GENBOX_CONSUMER":                 resulthandler.ConsumerPull,
		"GENBOX_ALLOW_INSECURE_CALLBACKS": "true",
		"GENBOX_DELIVERY_BACKOFF_MIN":     "100ms",
		"GENBOX_DELIVERY_BACKOFF_MAX":     "1s",
		"GENBOX_NOTICE_GRACE":             "1s",
	}
	return func(k string) string { return m[k] }
}

// topology is the production topology with a short redelivery backoff: a nack is redelivered
// after 100 ms rather than 10 s, for both systems alike.
func topology() bus.Topology {
	t := bus.DefaultTopology()
	t.AckDeadline = 10 * time.Second
	t.MinBackoff, t.MaxBackoff = 100*time.Millisecond, time.Second
	return t
}

// latencies draws each task's model latency from the distribution, as a pure function of the
// seed and the task id (a task's retries take as long as its first call), and remembers it.
type latencies struct {
	cfg Config
	mu  sync.Mutex
	of  map[string]time.Duration
}

func (l *latencies) draw(r geminitest.Request) time.Duration {
	id := taskIDRE.FindString(r.Prompt)
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], l.cfg.Seed)
	h := sha256.Sum256(append(b[:], id...))
	u := float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53)
	mean := float64(l.cfg.Latency)
	var d time.Duration
	switch l.cfg.Distribution {
	case DistUniform:
		d = time.Duration(mean/2 + u*mean)
	case DistExponential:
		d = time.Duration(min(-mean*math.Log(1-u), 5*mean))
	default:
		d = l.cfg.Latency
	}
	l.mu.Lock()
	l.of[id] = d
	l.mu.Unlock()
	return d
}

func (l *latencies) get(id string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.of[id]
	return d, ok
}

// stack is what both systems share in a run: the counted Firestore client, the counted
// publisher, the fake Gemini with its failures, the app's webhook receiver.
type stack struct {
	cfg      Config
	project  string
	counter  *fscount.Counter
	fs       *firestore.Client
	store    *store.Store
	ps       *pubsub.Client
	bp       *bus.Publisher
	pub      *countingPublisher
	fake     *geminitest.Server
	lat      *latencies
	in       *injector
	recv     *receiver
	recvURL  string
	secret   string
	reg      *prompts.Registry
	gen      *gemini.Client
	log      *slog.Logger
	closers  []func()
	stopping []func() // consumers, stopped before the clients close
}

func newStack(ctx context.Context, cfg Config, emu *emulator.Emulators, project string) (s *stack, err error) {
	s = &stack{cfg: cfg, project: project, counter: &fscount.Counter{}, in: newInjector(cfg.Seed), log: cfg.Log}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	bg := context.WithoutCancel(ctx)
	if s.fs, err = s.counter.EmulatorClient(bg, emu.FirestoreHost, project); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { s.fs.Close() })
	s.store = store.New(s.fs)
	if s.ps, err = pubsub.NewClient(bg, project); err != nil {
		return nil, fmt.Errorf("pubsub: %w", err)
	}
	s.closers = append(s.closers, func() { s.ps.Close() })
	if err := bus.Bootstrap(ctx, s.ps, topology()); err != nil {
		return nil, err
	}
	s.bp = bus.NewPublisher(s.ps)
	s.closers = append(s.closers, func() { s.bp.Close() })
	s.pub = newCountingPublisher(s.bp)

	s.lat = &latencies{cfg: cfg, of: map[string]time.Duration{}}
	s.fake = geminitest.NewServer(
		geminitest.WithLatency("", geminitest.Latency{Func: s.lat.draw}),
		geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
			if s.in.fail(failModel, taskIDRE.FindString(r.Prompt), cfg.ModelErrors) {
				return geminitest.Reply{Code: http.StatusServiceUnavailable, Message: "The model is overloaded. Please try again later."}
			}
			return geminitest.DefaultReply(r)
		}))
	s.closers = append(s.closers, s.fake.Close)

	if s.secret, err = webhook.NewSecret(); err != nil {
		return nil, err
	}
	if s.recv, err = newReceiver(s.secret, s.in, cfg.WebhookErrors); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("webhook receiver: %w", err)
	}
	srv := &http.Server{Handler: s.recv, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.closers = append(s.closers, func() { _ = srv.Close() })
	s.recvURL = "http://" + ln.Addr().String() + "/hook"
	if _, err := s.store.CreateTenant(ctx, benchTenant, store.DefaultLimits(), s.secret); err != nil {
		return nil, err
	}
	if s.reg, err = prompts.Default(); err != nil {
		return nil, err
	}
	gcfg, err := gemini.ConfigFromEnv(env(project, s.fake.URL, cfg.Concurrency))
	if err != nil {
		return nil, err
	}
	if s.gen, err = gemini.New(bg, gcfg, gemini.WithLogger(s.log), gemini.WithBreakerStore(s.store)); err != nil {
		return nil, err
	}
	return s, nil
}

// pull runs a pull consumer until the stack stops.
func (s *stack) pull(subscription string, concurrency int, h bus.Handler, onStop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := bus.Pull(ctx, s.ps, subscription, bus.PullSettings{MaxOutstandingMessages: concurrency, MaxExtension: 10 * time.Minute}, h); err != nil {
			s.log.Error("pull ended", "subscription", subscription, "error", err)
		}
	}()
	s.stopping = append(s.stopping, func() {
		cancel()
		if onStop != nil {
			t := time.AfterFunc(2*time.Second, onStop)
			defer t.Stop()
		}
		<-done
	})
}

// background runs f until the stack stops.
func (s *stack) background(f func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f(ctx) }()
	s.stopping = append(s.stopping, func() { cancel(); <-done })
}

// startGenbox runs genbox's worker (with its sweeper) and resulthandler, configured as the
// services configure themselves.
func (s *stack) startGenbox() error {
	getenv := env(s.project, s.fake.URL, s.cfg.Concurrency)
	wcfg, err := worker.FromEnv(getenv)
	if err != nil {
		return err
	}
	wpub := &lossyPublisher{next: s.pub, in: s.in, topic: bus.TopicResults, rate: s.cfg.ResultLoss}
	h := worker.New(s.store, s.gen, s.reg, wpub, s.log.With("service", "worker"), wcfg.Policy())
	s.pull(wcfg.Subscription, wcfg.Concurrency, lostAcks(h, s.in, s.cfg.AckLoss), h.Abort)
	sw := sweeper.New(s.store, s.pub, s.gen, s.log.With("service", "sweeper"), wcfg.Sweep, wcfg.Instance)
	s.background(func(ctx context.Context) { _ = sw.Run(ctx) })
	rcfg, err := resulthandler.FromEnv(getenv)
	if err != nil {
		return err
	}
	rh, err := resulthandler.New(s.store, s.store, s.pub, ssrf.NewClient(rcfg.SSRF()), s.log.With("service", "resulthandler"), rcfg.Policy)
	if err != nil {
		return err
	}
	s.pull(rcfg.Subscription, rcfg.Concurrency, rh, nil)
	return nil
}

// submit does what the publisher does for a new task: write it (due a grace later, so the
// sweeper leaves it to its own nudge), then nudge gemini-tasks.
func (s *stack) submit(ctx context.Context, id string) error {
	grace := time.Now().Add(time.Second)
	doc := &store.Task{ID: id, Tenant: benchTenant, Family: "summarize", Variant: "default",
		Input: input(id, s.cfg.InputBytes), State: task.StateQueued, CallbackURL: s.recvURL, NudgeAt: &grace}
	if err := s.store.CreateTask(ctx, doc); err != nil {
		return err
	}
	_, err := s.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: id})
	return err
}

// input is a task's text: its id (the fake's key) and filler up to n bytes.
func input(id string, n int) string {
	const filler = "The quarterly report shows steady growth in every region, with costs held flat and margins improving. "
	var b strings.Builder
	b.WriteString("Report " + id + ". ")
	for b.Len() < n {
		b.WriteString(filler)
	}
	return b.String()[:max(n, len(id)+9)]
}

func (s *stack) stop() {
	for i := len(s.stopping) - 1; i >= 0; i-- {
		s.stopping[i]()
	}
	s.stopping = nil
}

func (s *stack) close() {
	s.stop()
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// runSystem puts the workload through one system in its own project and measures it.
func runSystem(ctx context.Context, cfg Config, emu *emulator.Emulators, system, project string) (Result, error) {
	if err := emu.Setenv(); err != nil {
		return Result{}, err
	}
	s, err := newStack(ctx, cfg, emu, project)
	if err != nil {
		return Result{}, err
	}
	defer s.close()
	switch system {
	case systemGenbox:
		err = s.startGenbox()
	case systemNaive:
		err = s.startNaive()
	}
	if err != nil {
		return Result{}, err
	}
	resetPeakRSS()
	ops0 := s.counter.Counts()

	type done struct {
		id  string
		e2e time.Duration
		ok  bool
	}
	bar := startProgress(cfg.Progress, system, cfg.Tasks)
	work := make(chan int)
	results := make(chan done, cfg.Tasks)
	var submitErr error
	var errOnce sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() {
			for i := range work {
				id := taskID(i)
				t0 := time.Now()
				arrived := s.recv.wait(task.EventID(id, task.EventSucceeded, 0))
				if err := s.submit(ctx, id); err != nil {
					errOnce.Do(func() { submitErr = err })
					results <- done{id: id}
					continue
				}
				timer := time.NewTimer(cfg.Timeout)
				select {
				case <-arrived:
					results <- done{id: id, e2e: time.Since(t0), ok: true}
				case <-timer.C:
					results <- done{id: id}
				case <-ctx.Done():
					results <- done{id: id}
				}
				timer.Stop()
				bar.add()
			}
		})
	}
	for i := range cfg.Tasks {
		work <- i
	}
	close(work)
	wg.Wait()
	wall := time.Since(start)
	bar.stop()
	close(results)
	if submitErr != nil {
		return Result{}, fmt.Errorf("submit: %w", submitErr)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	// Let what the last tasks left in flight (redeliveries, re-nudges) run, then stop the
	// consumers and wait until every generation the fake started is billed.
	time.Sleep(time.Second + 2*cfg.Latency)
	s.stop()
	idle, cancel := context.WithTimeout(ctx, 5*cfg.Latency+10*time.Second)
	defer cancel()
	if err := s.fake.WaitIdle(idle); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return Result{}, err
	}

	r := Result{System: system, Tasks: cfg.Tasks, Wall: wall, Publishes: s.pub.counts(), Injected: s.in.counts(), PeakRSS: peakRSS()}
	ops := s.counter.Counts().Sub(ops0)
	r.FirestoreReads, r.FirestoreWrites, r.FirestoreCommits = ops.Reads, ops.Writes, ops.Commits
	var e2e, over []time.Duration
	var modelSum time.Duration
	for d := range results {
		if !d.ok {
			r.Lost++
			continue
		}
		r.Completed++
		e2e = append(e2e, d.e2e)
		m, _ := s.lat.get(d.id)
		modelSum += m
		over = append(over, d.e2e-m)
	}
	e2e, over = sortedCopy(e2e), sortedCopy(over)
	r.P50, r.P99 = percentile(e2e, 0.5), percentile(e2e, 0.99)
	r.OverheadP50, r.OverheadP99 = percentile(over, 0.5), percentile(over, 0.99)
	if r.Completed > 0 {
		r.ModelMean = modelSum / time.Duration(r.Completed)
		r.Throughput = float64(r.Completed) / wall.Seconds()
	}
	if r.ModelMean > 0 {
		r.Bound = float64(cfg.Concurrency) / r.ModelMean.Seconds()
	}
	led := s.fake.Ledger()
	r.ModelCalls, r.Generations = led.Total.Calls, led.Total.Generations
	r.BilledTokens = led.Total.Billed.TotalTokens
	r.NeededTokens = neededTokens(led)
	r.Webhooks, r.Duplicates, _ = s.recv.tally()
	return r, nil
}

// neededTokens is what the work needed: one generation per task billed at least once (the
// fake's answers are a function of the request, so every bill of a task costs the same).
func neededTokens(led geminitest.Ledger) int64 {
	once := map[string]int64{}
	for _, b := range led.Bills {
		id := taskIDRE.FindString(b.Request.Prompt)
		if _, ok := once[id]; !ok {
			once[id] = b.Usage.TotalTokens
		}
	}
	var n int64
	for _, v := range once {
		n += v
	}
	return n
}
