// Package bench is the workload generator behind `genbox bench`: it runs a closed-loop workload
// (tasks, concurrency, a model latency distribution, a failure mix) through genbox assembled
// in-process as `genbox dev` assembles it (internal/devstack), on the emulators with the fake
// Gemini, and, with the naive baseline, through the pattern the outbox replaces — generate, then
// publish, retry from scratch on any failure — under exactly the same failures, and reports
// throughput against the Little's-law bound, end-to-end latency and its overhead above the
// model's, Firestore operations and publishes per task, billed ÷ needed tokens from the fake's
// ledger, duplicates and the peak RSS. Tasks enter as the publisher writes them, without its HTTP
// API, for both systems alike.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// Latency distributions of the fake model.
const (
	DistFixed       = "fixed"       // every call takes the mean
	DistUniform     = "uniform"     // uniform over [mean/2, 3·mean/2]
	DistExponential = "exponential" // exponential with the mean, capped at 5·mean
)

// Baselines.
const (
	BaselineNone  = ""
	BaselineNaive = "naive" // generate then publish, retry from scratch, no outbox (naive.go)
)

// ErrConfig means a setting is invalid; the message names the flag.
var ErrConfig = errors.New("bench: invalid configuration")

// Config is one bench run.
type Config struct {
	Tasks        int           // --tasks: tasks submitted in all
	Concurrency  int           // --concurrency: tasks in flight at once (closed loop); with Backlog the worker's model-call slots
	Latency      time.Duration // --latency: the model's mean latency
	Distribution string        // --latency-dist: fixed, uniform or exponential
	InputBytes   int           // --input-bytes: size of each task's input
	// FileBytes, when set, gives each task a PDF of this size in Cloud Storage (the dev stack's
	// emulator) for the extract family: what files add to a task — the object's read, the
	// Files API upload and the copy's record — shows beside the text path.
	FileBytes int // --file-bytes

	// The failure mix; each rate is a probability decided per task and occurrence, the same for
	// genbox and the baseline.
	ModelErrors   float64 // --fail-model: model calls answered 503 UNAVAILABLE
	ResultLoss    float64 // --fail-result: the step after a generation (publishing its result) fails
	AckLoss       float64 // --fail-ack: acks of the worker lost (the message is delivered again)
	WebhookErrors float64 // --fail-webhook: webhook POSTs answered 503

	Baseline string // --baseline: "" or naive (run it too, side by side)
	// Backlog submits every task before the worker takes any, then lets it drain them with
	// Concurrency model-call slots (GENBOX_CONCURRENCY): a job queue's benchmark (River's, with
	// jobs queued first). Throughput is the drain's, and its bound slots ÷ mean model latency.
	Backlog bool // --backlog
	// Mode, when set, runs the workload online on the standard tier and then in this mode
	// (flex or batch; standard compares standard with itself), and reports cost per task ÷ the
	// standard run's.
	Mode string  // --mode
	Shed float64 // --shed: the fraction of flex requests the fake's Flex tier sheds
	// ContextCache runs seed 000's shape (about 9k tokens of shared family prefix, 2k of input,
	// 3.5k of output; Tasks of one family and a few of a cold one) with explicit context caching
	// off, then on, and reports the cost ratio against the break-even rule's prediction.
	ContextCache bool          // --context-cache
	Seed         uint64        // --seed: the failure decisions
	Timeout      time.Duration // --timeout: a task not done by then is counted lost
	Project      string        // --project: the project id prefix on the emulators
	// Warmup is how long at most fast tasks are put through genbox on the emulators before a
	// timed run, until they stop getting faster (warmup.go): the emulators are JVMs, and a fresh
	// pair serves a third as fast as it does once it has compiled its hot paths, which Firestore
	// and Pub/Sub never make a deployment wait for.
	Warmup time.Duration // --warmup

	// Tenants, when set, runs a multi-tenant workload (tenants.go): each tenant's backlog and cap,
	// drained by Instances worker instances of Concurrency model-call slots each, reported per
	// tenant against its bound.
	Tenants   []TenantLoad // --tenants
	Instances int          // --instances: worker instances (0 is one)

	// Progress receives the progress bar (nil: none); Log the services' logs (nil: discarded).
	Progress io.Writer
	Log      *slog.Logger
	// Getenv names the emulators (FIRESTORE_EMULATOR_HOST, PUBSUB_EMULATOR_HOST); os.Getenv when
	// nil. Emulators not named are started for the run and stopped after it.
	Getenv func(string) string

	run runKnobs // what a savings run changes (savings.go)
}

// DefaultConfig is the workload of a plain `genbox bench`.
func DefaultConfig() Config {
	return Config{
		Tasks: 200, Concurrency: 32, Latency: 500 * time.Millisecond, Distribution: DistExponential,
		InputBytes: 4000, ModelErrors: 0.05, ResultLoss: 0.1, AckLoss: 0.05, Seed: 1,
		Timeout: 2 * time.Minute, Project: "genbox-bench", Warmup: time.Minute,
	}
}

// RegisterFlags binds c's fields to flags of fs, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Tasks, "tasks", c.Tasks, "tasks to run in all")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "tasks in flight at once (closed loop)")
	fs.DurationVar(&c.Latency, "latency", c.Latency, "the fake model's mean latency")
	fs.StringVar(&c.Distribution, "latency-dist", c.Distribution, "latency distribution: fixed, uniform or exponential")
	fs.IntVar(&c.InputBytes, "input-bytes", c.InputBytes, "size of each task's input in bytes")
	fs.IntVar(&c.FileBytes, "file-bytes", c.FileBytes, "give each task a PDF of this many bytes in Cloud Storage (the extract family); 0: text only")
	fs.Float64Var(&c.ModelErrors, "fail-model", c.ModelErrors, "probability a model call is answered 503")
	fs.Float64Var(&c.ResultLoss, "fail-result", c.ResultLoss, "probability the step after a generation (publishing its result) fails")
	fs.Float64Var(&c.AckLoss, "fail-ack", c.AckLoss, "probability a worker's ack is lost (the message comes back)")
	fs.Float64Var(&c.WebhookErrors, "fail-webhook", c.WebhookErrors, "probability a webhook POST is answered 503")
	fs.StringVar(&c.Baseline, "baseline", c.Baseline, "also run a baseline under the same failures: naive")
	fs.BoolVar(&c.Backlog, "backlog", c.Backlog, "submit every task first, then let the worker drain them with --concurrency model-call slots")
	fs.StringVar(&c.Mode, "mode", c.Mode, "run the workload on the standard tier, then as flex or batch tasks, and compare cost per task")
	fs.Float64Var(&c.Shed, "shed", c.Shed, "with --mode flex: the fraction of flex requests the fake sheds")
	fs.BoolVar(&c.ContextCache, "context-cache", c.ContextCache, "run seed 000's shape (9k-token shared prefix) with context caching off, then on, and compare cost")
	fs.Func("tenants", `a multi-tenant workload: tenants separated by commas, each a name and colon-separated settings tasks=N, cap=N, weight=N, after=DURATION, urgent=DURATION, alone (e.g. "bulk:tasks=1000:cap=10,small:tasks=10:cap=10:after=5s:alone"); --concurrency is then each worker instance's model-call slots`, func(v string) error {
		t, err := ParseTenants(v)
		c.Tenants = t
		return err
	})
	fs.IntVar(&c.Instances, "instances", c.Instances, "with --tenants: worker instances (default one)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the failure decisions")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "a task not finished by then is counted lost")
	fs.StringVar(&c.Project, "project", c.Project, "project id prefix on the emulators")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "before a timed run, put fast tasks through the emulators until they stop getting faster (their JVMs have compiled their hot paths), for this long at most (0: none)")
}

// Validate reports every setting that cannot work, naming its flag.
func (c Config) Validate() error {
	var errs []error
	bad := func(flag, why string) { errs = append(errs, fmt.Errorf("%w: --%s %s", ErrConfig, flag, why)) }
	if c.Tasks < 1 {
		bad("tasks", "must be at least 1")
	}
	if c.Concurrency < 1 {
		bad("concurrency", "must be at least 1")
	}
	if c.Latency < 0 {
		bad("latency", "must not be negative")
	}
	switch c.Distribution {
	case DistFixed, DistUniform, DistExponential:
	default:
		bad("latency-dist", fmt.Sprintf("%q is not fixed, uniform or exponential", c.Distribution))
	}
	if c.InputBytes < 1 || c.InputBytes > 512<<10 {
		bad("input-bytes", "must be in 1..524288")
	}
	for flag, r := range map[string]float64{"fail-model": c.ModelErrors, "fail-result": c.ResultLoss, "fail-ack": c.AckLoss, "fail-webhook": c.WebhookErrors} {
		if !(r >= 0 && r < 1) {
			bad(flag, "must be a probability in [0, 1)")
		}
	}
	if c.FileBytes < 0 || c.FileBytes > 64<<20 {
		bad("file-bytes", "must be in 0..67108864")
	}
	if c.FileBytes > 0 && (c.Baseline != BaselineNone || c.ContextCache) {
		bad("file-bytes", "runs genbox's own workload with files; pass it without --baseline and --context-cache")
	}
	if c.Baseline != BaselineNone && c.Baseline != BaselineNaive {
		bad("baseline", fmt.Sprintf("%q is not naive", c.Baseline))
	}
	switch c.Mode {
	case ModeNone, ModeStandard, ModeFlex, ModeBatch:
	default:
		bad("mode", fmt.Sprintf("%q is not standard, flex or batch", c.Mode))
	}
	if !(c.Shed >= 0 && c.Shed < 1) || c.Shed > 0 && c.Mode != ModeFlex {
		bad("shed", "is a probability in [0, 1), with --mode flex")
	}
	if (c.Mode != ModeNone || c.ContextCache) && c.Baseline != BaselineNone {
		bad("baseline", "compares the plain workload; --mode and --context-cache bring their own baseline")
	}
	if c.Backlog && (c.Baseline != BaselineNone || c.Mode != ModeNone || c.ContextCache) {
		bad("backlog", "drains genbox's own backlog; pass it without --baseline, --mode and --context-cache")
	}
	if len(c.Tenants) > 0 && (c.Backlog || c.Baseline != BaselineNone || c.Mode != ModeNone || c.ContextCache) {
		bad("tenants", "runs its own workload; pass it without --backlog, --baseline, --mode and --context-cache")
	}
	if c.Instances < 0 || c.Instances > 1 && len(c.Tenants) == 0 {
		bad("instances", "is a count of worker instances, with --tenants")
	}
	if c.Mode != ModeNone && c.ContextCache {
		bad("context-cache", "runs its own workload; pass it without --mode")
	}
	if c.Timeout <= 0 {
		bad("timeout", "must be positive")
	}
	if c.Project == "" {
		bad("project", "must not be empty")
	}
	if c.Warmup < 0 {
		bad("warmup", "must not be negative")
	}
	return errors.Join(errs...)
}

// Result is what one system did with the workload.
type Result struct {
	System    string
	Tasks     int
	Completed int // tasks whose webhook arrived
	Lost      int // tasks whose webhook never arrived within the timeout
	Wall      time.Duration

	Throughput float64       // completed tasks per second (a backlog's: over the drain)
	Bound      float64       // Little's law: concurrency (a backlog's model-call slots) ÷ mean model latency, tasks per second
	ModelMean  time.Duration // mean model latency of the tasks (the fake's draws)
	// P50 and P99 are end to end: submit to the first verified webhook; in a backlog, from the
	// start of the drain.
	P50, P99 time.Duration
	// OverheadP50 and OverheadP99 are the quantiles of each task's end-to-end latency minus its
	// model latency; in a backlog, whose tasks wait before their call by design, of the time
	// from the call's answer to the webhook.
	OverheadP50, OverheadP99 time.Duration
	// Ramp and Tail are a backlog's ends, where its drain cannot keep every slot busy: from the
	// start of the drain until as many calls have started as there are slots (the first claims),
	// and from the last call's answer to the last webhook (the last output's commit, nudge and
	// delivery). Zero in the closed loop.
	Ramp, Tail time.Duration
	// WarmOverheadP50 and WarmOverheadP99 are the closed loop's overhead quantiles over its
	// WarmTasks, those submitted after the first webhook arrived: the steady state, without the
	// first tasks that wait for the stack's and the emulators' first requests.
	WarmTasks                        int
	WarmOverheadP50, WarmOverheadP99 time.Duration
	// CallTransport is what a model call cost its caller beyond the model's latency on this
	// machine, measured beside a backlog's drain (probeCalls): a slot holds it as it holds the
	// call, so slots ÷ (ModelMean + CallTransport) is the bound of a worker whose slots only ever
	// call the model. Zero in the closed loop.
	CallTransport time.Duration

	FirestoreReads, FirestoreWrites, FirestoreCommits int64
	// Ops breaks the Firestore operations down by the step of the path that made them, and Steps
	// the overhead by the step of the path it was spent in.
	Ops       []StepOps
	Steps     []StepLatency
	Publishes map[string]int // per topic

	ModelCalls   int   // calls that reached the fake (failed ones included)
	Generations  int   // billed generations
	BilledTokens int64 // total tokens the fake billed
	NeededTokens int64 // one generation per completed task

	Webhooks   int // distinct webhook-ids received
	Duplicates int // deliveries beyond the first of a webhook-id
	Injected   map[string]int
	PeakRSS    int64 // bytes: VmHWM of this process, reset before the run (the stack runs in it)

	// CostUSD is the fake's invoice at the bench's prices (2.5 Flash's list prices): every bill
	// at the tier that served it, cached tokens at the cached rate, caches' creation and storage.
	CostUSD   float64
	BatchJobs int                    // batch jobs the fake ran
	Caches    []geminitest.CacheBill // context caches the fake stored
	// FileCopies are the files the fake's Files API received; FileReads the billed generations
	// that read one (FileBytes).
	FileCopies, FileReads int
}

// PerTask divides n by the completed tasks.
func (r Result) PerTask(n int64) float64 {
	if r.Completed == 0 {
		return 0
	}
	return float64(n) / float64(r.Completed)
}

// Efficiency is throughput ÷ the Little's-law bound.
func (r Result) Efficiency() float64 {
	if r.Bound == 0 {
		return 0
	}
	return r.Throughput / r.Bound
}

// CallEfficiency is a backlog's throughput ÷ the bound at the model call's latency as its caller
// sees it (ModelMean + CallTransport): the share of the slots' time spent calling the model.
func (r Result) CallEfficiency() float64 {
	call := r.ModelMean + r.CallTransport
	if r.CallTransport == 0 || call <= 0 || r.Bound == 0 {
		return 0
	}
	return r.Throughput / (r.Bound * r.ModelMean.Seconds() / call.Seconds())
}

// BilledRatio is billed ÷ needed tokens: 1 means no generation was paid twice.
func (r Result) BilledRatio() float64 {
	if r.NeededTokens == 0 {
		return 0
	}
	return float64(r.BilledTokens) / float64(r.NeededTokens)
}

// TotalPublishes sums the publishes of every topic.
func (r Result) TotalPublishes() int64 {
	var n int64
	for _, v := range r.Publishes {
		n += int64(v)
	}
	return n
}

// Report is the outcome of Run: genbox, and the baseline when one was asked for; or, for
// --mode and --context-cache, the savings comparison.
type Report struct {
	Config  Config
	Warmup  Warmup // what was put through the emulators before the timed run
	Genbox  Result
	Naive   *Result
	Savings *Savings
	Tenants *TenantsReport
	Elapsed time.Duration
}

// Run runs the workload through genbox and, if cfg.Baseline asks, through the baseline, prints
// the report to out and returns it.
func Run(ctx context.Context, cfg Config, out io.Writer) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	start := time.Now()
	emu, err := emulator.Start(ctx, emulator.Options{Getenv: cfg.Getenv})
	if err != nil {
		return Report{}, err
	}
	defer emu.Stop()
	rep := Report{Config: cfg}
	suffix := fmt.Sprintf("-%d", time.Now().UnixNano()%1e9)
	if cfg.Mode != ModeNone || cfg.ContextCache {
		if rep.Savings, err = runSavings(ctx, cfg, emu, suffix); err != nil {
			return rep, err
		}
		rep.Elapsed = time.Since(start)
		rep.Savings.print(out, cfg)
		return rep, nil
	}
	if len(cfg.Tenants) > 0 {
		tr, err := runTenants(ctx, cfg, emu, suffix)
		if err != nil {
			return rep, fmt.Errorf("tenants: %w", err)
		}
		rep.Tenants, rep.Elapsed = &tr, time.Since(start)
		tr.Print(out)
		return rep, nil
	}
	if rep.Warmup, err = warmUp(ctx, cfg, emu, suffix); err != nil {
		return rep, err
	}
	if rep.Genbox, err = runSystem(ctx, cfg, emu, systemGenbox, cfg.Project+"-genbox"+suffix); err != nil {
		return rep, fmt.Errorf("genbox: %w", err)
	}
	if cfg.Baseline == BaselineNaive {
		r, err := runSystem(ctx, cfg, emu, systemNaive, cfg.Project+"-naive"+suffix)
		if err != nil {
			return rep, fmt.Errorf("naive baseline: %w", err)
		}
		rep.Naive = &r
	}
	rep.Elapsed = time.Since(start)
	rep.Print(out)
	return rep, nil
}

// Print writes the report as a table, genbox and the baseline side by side.
func (r Report) Print(w io.Writer) {
	c := r.Config
	if c.Backlog {
		fmt.Fprintf(w, "workload: backlog of %d tasks submitted first, drained with %d model-call slots, model latency %s (%s), input %d B\n",
			c.Tasks, c.Concurrency, c.Latency, c.Distribution, c.InputBytes)
	} else {
		fmt.Fprintf(w, "workload: %d tasks, concurrency %d, model latency %s (%s), input %d B\n",
			c.Tasks, c.Concurrency, c.Latency, c.Distribution, c.InputBytes)
	}
	if c.FileBytes > 0 {
		fmt.Fprintf(w, "files: each task reads a %d B PDF from Cloud Storage (the extract family)\n", c.FileBytes)
	}
	fmt.Fprintf(w, "failures: model 503 %.0f%%, result step lost %.0f%%, ack lost %.0f%%, webhook 503 %.0f%% (seed %d)\n",
		100*c.ModelErrors, 100*c.ResultLoss, 100*c.AckLoss, 100*c.WebhookErrors, c.Seed)
	fmt.Fprintf(w, "%s\n\n", r.Warmup)
	results := []Result{r.Genbox}
	if r.Naive != nil {
		results = append(results, *r.Naive)
	}
	row := func(name string, f func(Result) string) {
		fmt.Fprintf(w, "%-34s", name)
		for _, res := range results {
			fmt.Fprintf(w, " %26s", f(res))
		}
		fmt.Fprintln(w)
	}
	row("", func(r Result) string { return r.System })
	row("completed / lost", func(r Result) string { return fmt.Sprintf("%d / %d", r.Completed, r.Lost) })
	if c.Backlog {
		row("drain throughput (tasks/s)", func(r Result) string { return fmt.Sprintf("%.1f", r.Throughput) })
		row("bound: slots ÷ mean latency", func(r Result) string { return fmt.Sprintf("%.1f", r.Bound) })
		row("drain throughput ÷ bound", func(r Result) string { return fmt.Sprintf("%.3f", r.Efficiency()) })
		row("model call beyond its latency", func(r Result) string { return dur(r.CallTransport) })
		row("drain ÷ bound at that call latency", func(r Result) string { return fmt.Sprintf("%.3f", r.CallEfficiency()) })
	} else {
		row("throughput (tasks/s)", func(r Result) string { return fmt.Sprintf("%.1f", r.Throughput) })
		row("Little's-law bound (tasks/s)", func(r Result) string { return fmt.Sprintf("%.1f", r.Bound) })
		row("throughput ÷ bound", func(r Result) string { return fmt.Sprintf("%.2f", r.Efficiency()) })
	}
	row("mean model latency", func(r Result) string { return r.ModelMean.Round(time.Millisecond).String() })
	if c.Backlog {
		row("drain start to webhook p50 / p99", func(r Result) string { return dur(r.P50) + " / " + dur(r.P99) })
		row("answer to webhook p50 / p99", func(r Result) string { return dur(r.OverheadP50) + " / " + dur(r.OverheadP99) })
		row("ramp: drain start to every slot busy", func(r Result) string { return dur(r.Ramp) })
		row("tail: last answer to last webhook", func(r Result) string { return dur(r.Tail) })
	} else {
		row("end-to-end p50 / p99", func(r Result) string { return dur(r.P50) + " / " + dur(r.P99) })
		row("overhead p50 / p99", func(r Result) string { return dur(r.OverheadP50) + " / " + dur(r.OverheadP99) })
		row("warm: after the first webhook", func(r Result) string {
			return fmt.Sprintf("%s / %s (%d)", dur(r.WarmOverheadP50), dur(r.WarmOverheadP99), r.WarmTasks)
		})
	}
	row("Firestore reads / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(r.FirestoreReads)) })
	row("Firestore writes / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(r.FirestoreWrites)) })
	row("Firestore commits / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(r.FirestoreCommits)) })
	row("publishes / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(r.TotalPublishes())) })
	row("model calls / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(int64(r.ModelCalls))) })
	row("billed generations / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(int64(r.Generations))) })
	row("billed ÷ needed tokens", func(r Result) string { return fmt.Sprintf("%.3f", r.BilledRatio()) })
	if c.FileBytes > 0 {
		row("Files API copies / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(int64(r.FileCopies))) })
		row("generations that read their file", func(r Result) string { return fmt.Sprintf("%d", r.FileReads) })
	}
	row("webhook duplicates", func(r Result) string { return fmt.Sprintf("%d", r.Duplicates) })
	row("peak RSS (MiB)", func(r Result) string { return fmt.Sprintf("%.0f", float64(r.PeakRSS)/(1<<20)) })
	row("failures injected", func(r Result) string { return injected(r.Injected) })
	for _, res := range results {
		printSteps(w, res)
	}
	if r.Naive != nil && r.Naive.BilledTokens > 0 {
		saved := 1 - float64(r.Genbox.BilledTokens)/float64(r.Naive.BilledTokens)
		fmt.Fprintf(w, "\ngenbox billed %d tokens, the naive baseline %d: %.1f%% saved under the same failures.\n",
			r.Genbox.BilledTokens, r.Naive.BilledTokens, 100*saved)
	}
}

func dur(d time.Duration) string {
	if d >= 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func injected(m map[string]int) string {
	var parts []string
	for _, k := range []string{failModel, failPublish, failAck, failWebhook} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", strings.SplitN(k, "_", 2)[0], m[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}
