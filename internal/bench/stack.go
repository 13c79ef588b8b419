package bench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/fscount"
	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/objects/gcsfake"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
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

// nudgeGrace is GENBOX_NUDGE_GRACE in a bench run: how long the sweeper leaves a new task to its
// own nudge.
const nudgeGrace = 5 * time.Second

// webhookTimeout is GENBOX_WEBHOOK_TIMEOUT in a bench run: the receiver is local and answers at
// once. A finished task's delivery stays reserved for the worker's nudge for three times it (one
// delivery lease), so the resulthandler delivers under the reservation as in production.
const webhookTimeout = 2 * time.Second

// tenantWaitMax is the publisher's and the worker's GENBOX_TENANT_WAIT_MAX, which the bench
// leaves at its default: the not_before of a task submitted waiting for a slot.
const tenantWaitMax = 5 * time.Minute

// backlogGrace is the nudge grace of a backlog's tasks: the publisher's default
// GENBOX_NUDGE_GRACE, so that, as in production, the sweeper leaves a backlog to its nudges
// rather than nudging every task of it again while the worker drains it.
const backlogGrace = time.Minute

// taskIDRE finds a bench task id in a prompt, so the fake knows which task a call is for.
var taskIDRE = regexp.MustCompile(`\bbt\d{6}\b`)

func taskID(i int) string { return fmt.Sprintf("bt%06d", i) }

// env is the services' environment in a bench run: genbox's production defaults, with the
// durations that only pace recovery (nudge grace, sweep interval, backoffs, shutdown grace)
// shortened so a run takes seconds, the emulators of the run, and the fake Gemini as the model.
// devstack sets the project and the fake's URL itself; the naive baseline reads them from more.
func env(emu *emulator.Emulators, concurrency int, more map[string]string) func(string) string {
	m := map[string]string{
		emulator.FirestoreHostEnv:         emu.FirestoreHost,
		emulator.PubSubHostEnv:            emu.PubSubHost,
		"GENBOX_MODEL_CHAIN":              benchModel,
		"GENBOX_BACKOFF_BASE":             "20ms",
		"GENBOX_BACKOFF_MAX":              "200ms",
		"GENBOX_INSTANCE_ID":              "bench",
		"GENBOX_CONCURRENCY":              fmt.Sprint(2 * concurrency),
		"GENBOX_NUDGE_GRACE":              nudgeGrace.String(),
		"GENBOX_WEBHOOK_TIMEOUT":          webhookTimeout.String(),
		"GENBOX_RETRY_BASE":               "100ms",
		"GENBOX_RETRY_MAX":                "1s",
		"GENBOX_SWEEP_INTERVAL":           "250ms",
		"GENBOX_SWEEP_LEADER_TTL":         "2s",
		"GENBOX_SWEEP_BACKOFF_BASE":       "1s",
		"GENBOX_SWEEP_BACKOFF_MAX":        "2s",
		"GENBOX_SWEEP_PACE":               "2000",
		"GENBOX_SHUTDOWN_GRACE":           "2s",
		"GENBOX_CONSUMER":                 resulthandler.ConsumerPull,
		"GENBOX_ALLOW_INSECURE_CALLBACKS": "true",
		"GENBOX_DELIVERY_BACKOFF_MIN":     "100ms",
		"GENBOX_DELIVERY_BACKOFF_MAX":     "1s",
		"GENBOX_NOTICE_GRACE":             "1s",
		"GENBOX_PRICES":                   benchPrices,
	}
	maps.Copy(m, more)
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
// seed and the task id (a task's retries take as long as its first call), and remembers it and
// when the task's last call began.
type latencies struct {
	cfg Config
	tl  *timeline // marks each call's start and end
	// calls counts each tenant's calls in flight at the fake (a multi-tenant run's); nil: none.
	calls *tenantCalls
	mu    sync.Mutex
	of    map[string]time.Duration
	began map[string]time.Time
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
	now := time.Now()
	l.mu.Lock()
	l.of[id] = d
	l.began[id] = now
	l.mu.Unlock()
	l.tl.mark(id, markModelStart, now)
	l.tl.mark(id, markModelEnd, now.Add(d))
	l.calls.start(id, d)
	return d
}

func (l *latencies) get(id string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.of[id]
	return d, ok
}

// answered is when the task's last model call answered.
func (l *latencies) answered(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.began[id]
	return at.Add(l.of[id]), ok
}

// stack is a run's workload side, the same for both systems — the Firestore operation counter,
// the publish counts, the failure injector, the fake Gemini's latencies and failures, the app's
// webhook receiver — and the system under it, started by startGenbox or startNaive.
type stack struct {
	cfg     Config
	counter *fscount.Counter
	pubs    *publishCounts
	in      *injector
	lat     *latencies
	// transport is what a model call costs its caller beyond the model's latency (probeCalls),
	// measured during a backlog's drain.
	transport time.Duration
	tl        *timeline
	recv      *doubles.Receiver
	recvURL   string
	secret    string
	log       *slog.Logger
	// gate holds the worker's messages until it is closed (Backlog); nil: none.
	gate chan struct{}

	// Set by the system's start.
	store *store.Store
	slots *store.SlotHints // what the publisher reads to create a task waiting; nil: naive
	pub   Publisher        // the submissions' nudges, counted
	fake  *geminitest.Fake
	// storage is the dev stack's Cloud Storage emulator and objects its client (FileBytes).
	storage *gcsfake.Server
	objects *objects.Client
	// stopSystem stops the system's consumers and loops, leaving the fake and the clients up.
	stopSystem func(context.Context) error
	closers    []func()
}

func newStack(cfg Config) (s *stack, err error) {
	tl := newTimeline()
	s = &stack{cfg: cfg, counter: &fscount.Counter{Step: callerStep, OnWrite: tl.onWrite}, pubs: newPublishCounts(), in: newInjector(cfg.Seed), log: cfg.Log,
		lat: &latencies{cfg: cfg, of: map[string]time.Duration{}, began: map[string]time.Time{}, tl: tl}, tl: tl}
	if cfg.Backlog || len(cfg.Tenants) > 0 {
		s.gate = make(chan struct{})
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.secret, err = webhook.NewSecret(); err != nil {
		return nil, err
	}
	s.recv = doubles.New(s.secret)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("webhook receiver: %w", err)
	}
	srv := service.NewServer(lossyWebhooks(s.recv, s.in, cfg.WebhookErrors), service.Limits{})
	go func() { _ = srv.Serve(ln) }()
	s.closers = append(s.closers, func() { _ = srv.Close() })
	s.recvURL = "http://" + ln.Addr().String() + "/hook"
	return s, nil
}

// fakeOptions are the fake Gemini's latency distribution and injected 503s.
func (s *stack) fakeOptions() []geminitest.Option {
	return []geminitest.Option{
		geminitest.WithLatency("", geminitest.Latency{Func: s.lat.draw}),
		geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
			if s.in.fail(failModel, taskIDRE.FindString(r.Prompt), s.cfg.ModelErrors) {
				return geminitest.Reply{Code: http.StatusServiceUnavailable, Message: "The model is overloaded. Please try again later."}
			}
			return s.reply(r)
		}),
	}
}

// createTenant creates the bench tenant, signing with the receiver's secret, without a
// concurrency cap (a closed loop never has more tasks in flight than its drivers, a backlog than
// the slots): the single-tenant workloads measure an uncapped tenant, whose tasks never touch a
// slot count. --tenants measures caps.
func (s *stack) createTenant(ctx context.Context) error {
	limits := store.DefaultLimits()
	limits.Concurrency = 0
	_, err := s.store.CreateTenant(ctx, benchTenant, limits, s.secret)
	return err
}

// startGenbox runs genbox as `genbox dev` assembles it (internal/devstack) on the emulators,
// with the bench's counted Firestore client, counted publishers, the worker's lost result
// publishes and acks, and the bench's fake Gemini. A backlog run gives the worker exactly
// Concurrency model-call slots and holds its messages at the gate.
func (s *stack) startGenbox(ctx context.Context, emu *emulator.Emulators, project string) error {
	loopback := "127.0.0.1:0"
	more := s.cfg.run.env
	if s.cfg.Backlog || len(s.cfg.Tenants) > 0 {
		more = map[string]string{"GENBOX_CONCURRENCY": fmt.Sprint(s.cfg.Concurrency)}
	}
	st, err := devstack.Start(ctx, devstack.Config{
		Project:       project,
		PublisherAddr: loopback, DLQAddr: loopback, SlackAddr: loopback, WebhookAddr: loopback, GeminiAddr: loopback,
		Getenv:        env(emu, s.cfg.Concurrency, more),
		Log:           s.log,
		Topology:      topology(),
		Fake:          s.fakeOptions(),
		Workers:       s.cfg.Instances,
		OpenFirestore: s.counter.EmulatorClient,
		WrapPublisher: func(service string, p devstack.Publisher) devstack.Publisher {
			counted := &countingPublisher{next: p, counts: s.pubs}
			switch service {
			case devstack.ServicePublisher:
				s.pub = counted // submit publishes its nudges as the publisher service does
			case devstack.ServiceWorker:
				marked := &markingPublisher{next: counted, tl: s.tl, topic: bus.TopicResults, mark: markPublished}
				return &lossyPublisher{next: marked, in: s.in, topic: bus.TopicResults, rate: s.cfg.ResultLoss}
			}
			return counted
		},
		WrapHandler: func(service string, h bus.Handler) bus.Handler {
			if service == devstack.ServiceWorker {
				return gated(lostAcks(h, s.in, s.cfg.AckLoss), s.gate)
			}
			return h
		},
	})
	if err != nil {
		return err
	}
	s.closers = append(s.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Close(ctx); err != nil {
			s.log.ErrorContext(ctx, "close the genbox stack", "error", err)
		}
	})
	s.store, s.fake, s.stopSystem = st.Store, st.Fake, st.StopServices
	s.slots = store.NewSlotHints(st.Store)
	s.storage, s.objects = st.Storage, st.Objects
	if len(s.cfg.Tenants) > 0 {
		return s.createTenants(ctx)
	}
	return s.createTenant(ctx)
}

// submit does what the publisher does for a new task, without its HTTP API (whose cost
// BenchmarkSubmitOverhead in internal/publisher measures), so that genbox and the naive baseline
// start from the same submission: write the task (due a grace later, so the sweeper leaves it to
// its own nudge), then nudge gemini-tasks.
func (s *stack) submit(ctx context.Context, id string, grace time.Duration) error {
	return s.submitAs(ctx, benchTenant, id, grace, task.DefaultPriority)
}

// submitAs is submit for a task of tenant, of priority.
func (s *stack) submitAs(ctx context.Context, tenant, id string, grace time.Duration, priority int) error {
	now := time.Now()
	nudgeAt := now.Add(grace)
	doc := &protocol.Task{ID: id, Tenant: tenant, Family: s.familyOf(id), Variant: "default", Priority: priority,
		Input: input(id, s.cfg.InputBytes), State: task.StateQueued, CallbackURL: s.recvURL, NudgeAt: &nudgeAt, Mode: s.cfg.run.mode}
	if s.slots != nil { // nil: the naive baseline has no slots
		s.slots.SubmitWaiting(ctx, doc, tenantWaitMax, now)
	}
	if s.cfg.FileBytes > 0 {
		f, err := s.putFile(ctx, id)
		if err != nil {
			return err
		}
		doc.Family, doc.Files = "extract", []protocol.File{f}
	}
	if err := s.store.CreateTask(ctx, doc); err != nil {
		return err
	}
	_, err := s.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: id, task.AttrTenant: doc.Tenant,
		task.AttrFamily: doc.Family, task.AttrVariant: doc.Variant}) // the publisher's nudge
	return err
}

// putFile writes task id's PDF of FileBytes to the storage emulator, as an upload would, and
// returns the file as the publisher records it (the object's attributes, one read).
func (s *stack) putFile(ctx context.Context, id string) (protocol.File, error) {
	name := "uploads/" + benchTenant + "/" + id
	s.storage.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: devstack.DevInputBucket, Name: name,
		ContentType: "application/pdf"}, Content: []byte(input("%PDF-1.7 "+id, s.cfg.FileBytes))})
	a, err := s.objects.Attrs(ctx, devstack.DevInputBucket, name)
	if err != nil {
		return protocol.File{}, err
	}
	return protocol.FileOf(a.Bucket, a.Object, a.Generation, a.Size, a.CRC32C, a.MD5, "application/pdf", ""), nil
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

func (s *stack) close() {
	if s.stopSystem != nil {
		_ = s.stopSystem(context.Background())
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// runSystem puts the workload through one system in its own project and measures it.
func runSystem(ctx context.Context, cfg Config, emu *emulator.Emulators, system, project string) (Result, error) {
	s, err := newStack(cfg)
	if err != nil {
		return Result{}, err
	}
	defer s.close()
	switch system {
	case systemGenbox:
		err = s.startGenbox(ctx, emu, project)
	case systemNaive:
		err = s.startNaive(ctx, emu, project)
	}
	if err != nil {
		return Result{}, err
	}
	if cfg.run.setup != nil {
		cfg.run.setup(s.fake)
	}
	resetPeakRSS()
	ops0, steps0 := s.counter.Counts(), s.counter.ByStep()

	bar := startProgress(cfg.Progress, system, cfg.Tasks)
	drive := s.closedLoop
	if cfg.Backlog {
		drive = s.drainBacklog
	}
	results, wall, err := drive(ctx, bar)
	bar.stop()
	if err != nil {
		return Result{}, err
	}
	// Let what the last tasks left in flight (redeliveries, re-nudges) run, then stop the
	// system's consumers and loops and wait until every generation the fake started is billed.
	time.Sleep(time.Second + 2*cfg.Latency)
	if err := s.stopSystem(ctx); err != nil {
		return Result{}, err
	}
	idle, cancel := context.WithTimeout(ctx, 5*cfg.Latency+10*time.Second)
	defer cancel()
	if err := s.fake.WaitIdle(idle); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return Result{}, err
	}

	r := Result{System: system, Tasks: cfg.Tasks, Wall: wall, Publishes: s.pubs.counts(), Injected: s.in.counts(), PeakRSS: PeakRSS(os.Getpid())}
	ops := s.counter.Counts().Sub(ops0)
	r.FirestoreReads, r.FirestoreWrites, r.FirestoreCommits = ops.Reads, ops.Writes, ops.Commits
	r.Ops = stepOps(s.counter.ByStep(), steps0)
	var e2e, over []time.Duration
	overOf := map[string]time.Duration{}
	var modelSum time.Duration
	for _, d := range results {
		if !d.ok {
			r.Lost++
			continue
		}
		r.Completed++
		e2e = append(e2e, d.e2e)
		m, _ := s.lat.get(d.id)
		modelSum += m
		over = append(over, d.over)
		overOf[d.id] = d.over
	}
	r.Steps = s.tl.stepLatencies(overOf)
	if cfg.Backlog {
		r.Ramp, r.Tail = drainEnds(results, s.lat, cfg.Concurrency, wall)
		r.CallTransport = s.transport
	}
	e2e, over = sortedCopy(e2e), sortedCopy(over)
	r.P50, r.P99 = percentile(e2e, 0.5), percentile(e2e, 0.99)
	r.OverheadP50, r.OverheadP99 = percentile(over, 0.5), percentile(over, 0.99)
	if !cfg.Backlog {
		warm := s.tl.warm()
		var warmOver []time.Duration
		for id, o := range overOf {
			if warm[id] {
				warmOver = append(warmOver, o)
			}
		}
		warmOver = sortedCopy(warmOver)
		r.WarmTasks, r.WarmOverheadP50, r.WarmOverheadP99 = len(warmOver), percentile(warmOver, 0.5), percentile(warmOver, 0.99)
	}
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
	r.CostUSD, r.BatchJobs, r.Caches = led.CostUSD(benchPricing), len(led.Batches), led.Caches
	r.FileCopies = len(s.fake.Files())
	for _, b := range led.Bills {
		if len(b.Request.Files) > 0 {
			r.FileReads++
		}
	}
	r.Webhooks, r.Duplicates, _ = s.recv.Tally()
	return r, nil
}

// done is how one task of a run ended.
type done struct {
	id string
	ok bool // its webhook arrived within the timeout
	// e2e is the closed loop's end-to-end latency (submit to webhook), and a backlog's time from
	// the start of the drain to the webhook.
	e2e time.Duration
	// over is what the task took beyond its model call: e2e minus the model's latency in the
	// closed loop; in a backlog, which waits before the call by design, the webhook's arrival
	// after the call answered.
	over time.Duration
}

// closedLoop keeps cfg.Concurrency tasks in flight: each driver submits a task, waits for its
// webhook, then submits the next. It returns the tasks and the wall time of the run.
func (s *stack) closedLoop(ctx context.Context, bar *progress) ([]done, time.Duration, error) {
	cfg := s.cfg
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
				s.tl.mark(id, markSubmitted, t0)
				arrived := s.recv.Delivered(task.EventID(id, task.EventSucceeded, 0))
				if err := s.submit(ctx, id, nudgeGrace); err != nil {
					errOnce.Do(func() { submitErr = err })
					results <- done{id: id}
					continue
				}
				timer := time.NewTimer(cfg.Timeout)
				select {
				case <-arrived:
					e2e := time.Since(t0)
					s.tl.mark(id, markDelivered, t0.Add(e2e))
					m, _ := s.lat.get(id)
					results <- done{id: id, e2e: e2e, over: e2e - m, ok: true}
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
	close(results)
	if submitErr != nil {
		return nil, 0, fmt.Errorf("submit: %w", submitErr)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var out []done
	for d := range results {
		out = append(out, d)
	}
	return out, wall, nil
}

// backlogSubmitters submit a backlog's tasks side by side.
const backlogSubmitters = 16

// drainBacklog submits every task while the worker's messages wait at the gate, then opens it
// and waits until every webhook has arrived or cfg.Timeout has passed since. The wall time is
// the drain's: from the gate's opening to the last webhook.
func (s *stack) drainBacklog(ctx context.Context, bar *progress) ([]done, time.Duration, error) {
	cfg := s.cfg
	ids := make(chan string)
	submitted := make(chan error, backlogSubmitters)
	for range backlogSubmitters {
		go func() {
			var err error
			for id := range ids {
				if err == nil {
					err = s.submit(ctx, id, backlogGrace)
				}
			}
			submitted <- err
		}()
	}
	arrived := make([]<-chan struct{}, cfg.Tasks)
	for i := range cfg.Tasks {
		id := taskID(i)
		arrived[i] = s.recv.Delivered(task.EventID(id, task.EventSucceeded, 0))
		ids <- id
	}
	close(ids)
	var errs []error
	for range backlogSubmitters {
		errs = append(errs, <-submitted)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, 0, fmt.Errorf("submit: %w", err)
	}
	drained := make(chan struct{})
	probed, err := probeCalls(ctx, cfg.Latency, cfg.InputBytes, drained)
	if err != nil {
		return nil, 0, err
	}
	endProbe := sync.OnceValues(func() (time.Duration, error) {
		close(drained)
		return probed()
	})
	defer func() { _, _ = endProbe() }() // ends the probe on an early return, whose own error is reported
	start := time.Now()
	close(s.gate)
	deadline := time.NewTimer(cfg.Timeout)
	defer deadline.Stop()
	out := make([]done, cfg.Tasks)
	last := start
	for i := range cfg.Tasks {
		id := taskID(i)
		out[i] = done{id: id}
		select {
		case <-arrived[i]:
		case <-deadline.C:
			continue
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
		at := s.recv.Deliveries(task.EventID(id, task.EventSucceeded, 0))[0].At
		answered, _ := s.lat.answered(id)
		out[i] = done{id: id, ok: true, e2e: at.Sub(start), over: at.Sub(answered)}
		if at.After(last) {
			last = at
		}
		bar.add()
	}
	if s.transport, err = endProbe(); err != nil {
		return nil, 0, err
	}
	return out, last.Sub(start), nil
}

// drainEnds returns a backlog's ramp — from the start of the drain until the slots-th call
// started — and its tail — from the last answer to the last webhook, wall after the start —,
// from its tasks' times after the start (each task's last call).
func drainEnds(results []done, lat *latencies, slots int, wall time.Duration) (ramp, tail time.Duration) {
	var starts []time.Duration
	var lastAnswer time.Duration
	for _, d := range results {
		if !d.ok {
			continue
		}
		answer := d.e2e - d.over
		m, _ := lat.get(d.id)
		starts = append(starts, answer-m)
		lastAnswer = max(lastAnswer, answer)
	}
	if len(starts) == 0 {
		return 0, 0
	}
	slices.Sort(starts)
	return starts[min(slots, len(starts))-1], wall - lastAnswer
}

// gated holds every message of h until gate is closed; a nil gate holds none. A message whose
// pull stops first is nacked: nothing was done.
func gated(h bus.Handler, gate <-chan struct{}) bus.Handler {
	if gate == nil {
		return h
	}
	return bus.HandlerFunc(func(ctx context.Context, m *bus.Message) bus.Result {
		select {
		case <-gate:
			return h.Handle(ctx, m)
		case <-ctx.Done():
			return bus.Nack
		}
	})
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
