package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Modes of a savings run (--mode): the workload runs online on the standard tier, then in the
// mode, and the report compares what each task cost.
const (
	ModeNone     = ""
	ModeStandard = string(task.ModeStandard)
	ModeFlex     = string(task.ModeFlex)
	ModeBatch    = string(task.ModeBatch)
)

// benchPrices prices the bench's model at 2.5 Flash's list prices, so that cost figures are
// Gemini's.
const benchPrices = benchModel + "=0.30/2.50;flex=0.15/1.25;batch=0.15/1.25;cached=0.03;storage=1.00"

// benchPricing is benchPrices as the ledger prices bills with.
var benchPricing = func() gemini.Pricing {
	p, err := gemini.ParsePrices(benchPrices)
	if err != nil {
		panic(err)
	}
	return gemini.Pricing{Prices: p}
}()

// runKnobs are what a savings run changes in the workload and the stack; the zero value is the
// plain bench.
type runKnobs struct {
	label string
	mode  task.Mode
	// env is added to the services' environment.
	env map[string]string
	// family names the tasks' family (summarize when ""); the last coldTasks tasks are of
	// coldFamily instead.
	family, coldFamily string
	coldTasks          int
	// outputBytes, when positive, sizes every answer (the fake's own answers are short).
	outputBytes int
	// setup adjusts the fake Gemini once the stack runs.
	setup func(f *geminitest.Fake)
}

// familyOf is the family of task id.
func (s *stack) familyOf(id string) string {
	k := s.cfg.run
	if k.coldTasks > 0 {
		var i int
		if _, err := fmt.Sscanf(id, "bt%06d", &i); err == nil && i >= s.cfg.Tasks-k.coldTasks {
			return k.coldFamily
		}
	}
	if k.family != "" {
		return k.family
	}
	return "summarize"
}

// reply is the fake's answer to a call of the workload: its own, or one outputBytes long.
func (s *stack) reply(r geminitest.Request) geminitest.Reply {
	reply := geminitest.DefaultReply(r)
	if n := s.cfg.run.outputBytes; n > 0 && reply.Text != "" {
		reply.Text = strings.Repeat(reply.Text+" ", n/(len(reply.Text)+1)+1)[:n]
	}
	return reply
}

// Savings is the outcome of a savings run: the baseline first, then the run it is compared with.
type Savings struct {
	Title string
	Base  Result
	Run   Result
	// For a context-cache run: the ratio the break-even rule predicts, the break-even N*, and
	// the caches each family got.
	Predicted              float64
	BreakEven              float64
	HotCaches, ColdCaches  int
	HotFamily, ColdFamily  string
	HotTasks, ColdTasksRun int
}

// Ratio is the run's cost per task ÷ the baseline's.
func (s Savings) Ratio() float64 {
	b, r := s.Base.PerTaskCost(), s.Run.PerTaskCost()
	if b == 0 {
		return 0
	}
	return r / b
}

// PerTaskCost is what the run cost per completed task, as the fake's invoice prices it.
func (r Result) PerTaskCost() float64 {
	if r.Completed == 0 {
		return 0
	}
	return r.CostUSD / float64(r.Completed)
}

// runSavings runs the workload of cfg's mode, or the context-cache comparison.
func runSavings(ctx context.Context, cfg Config, emu *emulator.Emulators, suffix string) (*Savings, error) {
	if cfg.ContextCache {
		return runContextCache(ctx, cfg, emu, suffix)
	}
	base, other := cfg, cfg
	base.run = runKnobs{label: ModeStandard}
	other.run = runKnobs{label: cfg.Mode, mode: task.Mode(cfg.Mode)}
	switch cfg.Mode {
	case ModeBatch:
		// A nightly job submits everything at once; the Batch API's turnaround is seconds here.
		other.Concurrency = cfg.Tasks
		other.run.env = map[string]string{
			"GENBOX_BATCH_INTERVAL": "200ms", "GENBOX_BATCH_WAIT": "1s", "GENBOX_BATCH_POLL_MAX": "500ms",
			"GENBOX_BATCH_LEASE_TTL": "5s", "GENBOX_BATCH_LEADER_TTL": "1s",
		}
		other.run.setup = func(f *geminitest.Fake) {
			f.SetBatchPlan(benchModel, geminitest.BatchPlan{Pending: 500 * time.Millisecond, Running: time.Second})
		}
		other.run.label = fmt.Sprintf("batch (all %d at once)", cfg.Tasks)
	case ModeFlex:
		other.run.setup = func(f *geminitest.Fake) { f.SetShedding(benchModel, geminitest.Shedding{Fraction: cfg.Shed}) }
		other.run.label = fmt.Sprintf("flex (%.0f%% shed)", 100*cfg.Shed)
	}
	sv := &Savings{Title: fmt.Sprintf("%s vs standard", cfg.Mode)}
	var err error
	if sv.Base, err = runSystem(ctx, base, emu, systemGenbox, cfg.Project+"-standard"+suffix); err != nil {
		return nil, fmt.Errorf("standard run: %w", err)
	}
	if sv.Run, err = runSystem(ctx, other, emu, systemGenbox, cfg.Project+"-"+cfg.Mode+suffix); err != nil {
		return nil, fmt.Errorf("%s run: %w", cfg.Mode, err)
	}
	sv.Base.System, sv.Run.System = base.run.label, other.run.label
	return sv, nil
}

// The context-cache workload, seed 000's shape: about 9k tokens of a family's shared prefix and
// 2k of each task's own input, about 3.5k tokens of output.
const (
	hotFamily   = "report"
	coldFamily  = "memo"
	prefixBytes = 36_000
	ownBytes    = 8_000
	outputBytes = 14_000
	coldTasks   = 3
	contextTTL  = time.Hour
)

// runContextCache runs seed 000's shape twice, explicit caching off then on (GENBOX_CONTEXT_CACHE_TTL
// 0 and 1h), with a cold family of a few tasks beside the hot one, and predicts the cost ratio
// from the break-even rule.
func runContextCache(ctx context.Context, cfg Config, emu *emulator.Emulators, suffix string) (*Savings, error) {
	dir, err := os.MkdirTemp("", "genbox-bench-families")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	hotSystem := strings.Repeat("Cite every figure with its source and keep names as written. ", prefixBytes/61)
	coldSystem := strings.Repeat("Answer in three short paragraphs and never guess a number. ", prefixBytes/59)
	for name, system := range map[string]string{hotFamily: hotSystem, coldFamily: coldSystem} {
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(familyFile(name, system)), 0o600); err != nil {
			return nil, err
		}
	}
	cfg.InputBytes = ownBytes
	knobs := func(label, ttl string) runKnobs {
		return runKnobs{label: label, family: hotFamily, coldFamily: coldFamily, coldTasks: coldTasks, outputBytes: outputBytes,
			env: map[string]string{"GENBOX_PROMPTS_DIR": dir, "GENBOX_CONTEXT_CACHE_TTL": ttl}}
	}
	off, on := cfg, cfg
	off.Tasks, on.Tasks = cfg.Tasks+coldTasks, cfg.Tasks+coldTasks
	off.run, on.run = knobs("context cache off", "0"), knobs("context cache on", contextTTL.String())
	sv := &Savings{Title: "context cache on vs off", HotFamily: hotFamily, ColdFamily: coldFamily, HotTasks: cfg.Tasks, ColdTasksRun: coldTasks}
	if sv.Base, err = runSystem(ctx, off, emu, systemGenbox, cfg.Project+"-cacheoff"+suffix); err != nil {
		return nil, fmt.Errorf("cache off: %w", err)
	}
	if sv.Run, err = runSystem(ctx, on, emu, systemGenbox, cfg.Project+"-cacheon"+suffix); err != nil {
		return nil, fmt.Errorf("cache on: %w", err)
	}
	sv.Base.System, sv.Run.System = off.run.label, on.run.label
	price := benchPricing.Price(benchModel)
	sv.BreakEven = price.CacheBreakEven(contextTTL.Hours())
	var prefixTokens int64
	for _, c := range sv.Run.Caches {
		if strings.HasSuffix(c.DisplayName, store.PrefixSHA(strings.TrimSpace(hotSystem))) {
			sv.HotCaches++
			prefixTokens = c.Tokens
		} else {
			sv.ColdCaches++
		}
	}
	sv.Predicted = predictCacheRatio(sv.Base, price, cfg.Tasks, prefixTokens, sv.BreakEven)
	return sv, nil
}

// familyFile is a context_cache family with system as its shared prefix.
func familyFile(name, system string) string {
	return fmt.Sprintf(`family: %s
version: "1"
context_cache: true
config:
  max_output_tokens: 4096
max_output_tokens_limit: 8192
system: %q
template: "{{.Input}}"
variants:
  default: {}
`, name, system)
}

// predictCacheRatio is what the break-even rule predicts the caching run costs ÷ the uncached
// run: of n hot tasks, the first ⌈N*⌉−1 (fewer reuses than the break-even) send the prefix
// whole; the use that passes it creates the cache (its prefix once at the input price and its
// storage for a TTL) and it and every later one send T cached tokens at the cached rate; the
// cold family's tasks cost the same either way. The token shape is the uncached run's.
func predictCacheRatio(off Result, price gemini.Price, n int, prefix int64, breakEven float64) float64 {
	if off.CostUSD == 0 || prefix == 0 || n == 0 {
		return 0
	}
	saved := float64(prefix) * (price.InputPerM - price.CachedInputPerM) / 1e6
	cached := max(n-int(math.Floor(breakEven)), 0) // uses ⌊N*⌋+1 … n
	on := off.CostUSD - float64(cached)*saved + price.Cost(prefix, 0) + price.Storage(prefix, contextTTL.Hours())
	return on / off.CostUSD
}

// print writes the savings report.
func (s Savings) print(w io.Writer, cfg Config) {
	fmt.Fprintf(w, "savings: %s; %d tasks, model priced as gemini-2.5-flash (%s), failures: model 503 %.0f%%, result step lost %.0f%%, ack lost %.0f%%\n\n",
		s.Title, cfg.Tasks, benchPrices, 100*cfg.ModelErrors, 100*cfg.ResultLoss, 100*cfg.AckLoss)
	row := func(name string, f func(Result) string) {
		fmt.Fprintf(w, "%-28s %26s %26s\n", name, f(s.Base), f(s.Run))
	}
	row("", func(r Result) string { return r.System })
	row("completed / lost", func(r Result) string { return fmt.Sprintf("%d / %d", r.Completed, r.Lost) })
	row("cost per task (USD)", func(r Result) string { return fmt.Sprintf("%.6f", r.PerTaskCost()) })
	row("billed ÷ needed tokens", func(r Result) string { return fmt.Sprintf("%.3f", r.BilledRatio()) })
	row("model calls / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(int64(r.ModelCalls))) })
	row("batch jobs", func(r Result) string { return fmt.Sprintf("%d", r.BatchJobs) })
	if cfg.FileBytes > 0 {
		row("Files API copies / task", func(r Result) string { return fmt.Sprintf("%.2f", r.PerTask(int64(r.FileCopies))) })
	}
	row("context caches", func(r Result) string { return fmt.Sprintf("%d", len(r.Caches)) })
	row("end-to-end p50 / p99", func(r Result) string { return dur(r.P50) + " / " + dur(r.P99) })
	fmt.Fprintln(w)
	if s.Predicted > 0 || cfg.ContextCache {
		fmt.Fprintf(w, "cost with caching ÷ without (storage included): %.3f; the break-even rule predicts %.3f (N* = %.2f reuses per %s of TTL); caches: %s %d, %s (%d tasks) %d; lost %d\n",
			s.Ratio(), s.Predicted, s.BreakEven, contextTTL, s.HotFamily, s.HotCaches, s.ColdFamily, s.ColdTasksRun, s.ColdCaches, s.Base.Lost+s.Run.Lost)
		return
	}
	fmt.Fprintf(w, "cost per task ÷ the online (standard) run's: %.3f (%s); billed ÷ needed %.3f; lost %d\n",
		s.Ratio(), s.Run.System, s.Run.BilledRatio(), s.Run.Lost)
}
