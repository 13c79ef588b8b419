package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// small is a workload short enough for CI with every kind of failure, on the run's emulators.
func small(t testing.TB) Config {
	t.Helper()
	emulator.Require(t)
	c := DefaultConfig()
	c.Tasks, c.Concurrency, c.Latency, c.Distribution, c.InputBytes = 16, 4, 50*time.Millisecond, DistUniform, 1000
	c.ModelErrors, c.ResultLoss, c.AckLoss, c.WebhookErrors = 0.1, 0.3, 0.2, 0.1
	c.Baseline = BaselineNaive
	c.Timeout, c.Warmup = time.Minute, 0
	c.Project = "bench-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))[:min(len(t.Name()), 12)]
	return c
}

// runLogged runs the bench with cfg, logs its report and returns it with its text.
func runLogged(tb testing.TB, cfg Config) (Report, string) {
	tb.Helper()
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("\n%s", out.String())
	return rep, out.String()
}

// Under the same failures genbox completes every task, delivers each webhook-id once, and never
// pays for a generation twice, while the naive baseline pays again for every lost result step;
// the report prints the ratios it measured.
func TestRunGenboxAgainstNaive(t *testing.T) {
	t.Parallel()
	cfg := small(t)
	var bar bytes.Buffer
	cfg.Progress = &bar
	rep, out := runLogged(t, cfg)
	g, n := rep.Genbox, rep.Naive
	if g.WarmTasks <= 0 || g.WarmTasks >= g.Completed || g.WarmOverheadP99 <= 0 || !strings.Contains(out, "warm: after the first webhook") {
		t.Errorf("%d warm tasks of %d, warm overhead p99 %s: want the steady state's quantiles, over the tasks submitted after the first webhook", g.WarmTasks, g.Completed, g.WarmOverheadP99)
	}
	if n == nil {
		t.Fatal("no naive result")
	}
	if g.Completed != cfg.Tasks || g.Lost != 0 {
		t.Errorf("genbox completed %d of %d, lost %d", g.Completed, cfg.Tasks, g.Lost)
	}
	if g.BilledRatio() != 1 || g.Generations != cfg.Tasks {
		t.Errorf("genbox billed %d tokens for %d needed (%d generations for %d tasks)", g.BilledTokens, g.NeededTokens, g.Generations, cfg.Tasks)
	}
	if g.Injected[failPublish] == 0 || n.Injected[failPublish] == 0 {
		t.Fatalf("no result step failed: genbox %v naive %v", g.Injected, n.Injected)
	}
	// Every lost result step of the naive baseline is a generation bought again.
	if n.Generations < n.Completed+n.Injected[failPublish] || n.BilledRatio() <= 1 {
		t.Errorf("naive: %d generations for %d tasks with %d lost results, billed ratio %.3f", n.Generations, n.Completed, n.Injected[failPublish], n.BilledRatio())
	}
	if g.Webhooks != cfg.Tasks {
		t.Errorf("genbox: %d distinct webhook-ids, want %d", g.Webhooks, cfg.Tasks)
	}
	if g.FirestoreWrites == 0 || g.FirestoreReads == 0 || g.TotalPublishes() < int64(2*cfg.Tasks) {
		t.Errorf("genbox operations not counted: reads %d writes %d publishes %v", g.FirestoreReads, g.FirestoreWrites, g.Publishes)
	}
	if g.Bound <= 0 || g.Throughput <= 0 || g.P99 < g.P50 || g.P50 < g.ModelMean/2 {
		t.Errorf("genbox timings: %+v", g)
	}
	for _, want := range []string{"throughput ÷ bound", "billed ÷ needed tokens", "naive"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if !strings.Contains(bar.String(), "genbox") || !strings.Contains(bar.String(), "16/16") {
		t.Errorf("progress bar: %q", bar.String())
	}
}

// A backlog run submits every task before the worker takes any, so its drain can never beat
// the bound of its model-call slots: with a fixed latency, 32 tasks on 4 slots take at least 8
// rounds of the model. Each task is generated and delivered once, and the report and its JSON
// say the throughput is the drain's.
func TestRunBacklog(t *testing.T) {
	t.Parallel()
	cfg := small(t)
	cfg.Baseline, cfg.Backlog = BaselineNone, true
	cfg.Tasks, cfg.Concurrency, cfg.Latency, cfg.Distribution = 32, 4, 100*time.Millisecond, DistFixed
	cfg.ModelErrors, cfg.ResultLoss, cfg.AckLoss, cfg.WebhookErrors = 0, 0, 0, 0
	rep, out := runLogged(t, cfg)
	g := rep.Genbox
	if g.Completed != cfg.Tasks || g.Lost != 0 || g.Generations != cfg.Tasks || g.BilledRatio() != 1 || g.Duplicates != 0 {
		t.Errorf("completed %d lost %d, %d generations, billed ratio %.3f, %d duplicates; want %d tasks each generated and delivered once",
			g.Completed, g.Lost, g.Generations, g.BilledRatio(), g.Duplicates, cfg.Tasks)
	}
	if want := 4 / cfg.Latency.Seconds(); g.Bound != want {
		t.Errorf("bound %.1f tasks/s, want the slots ÷ the latency: %.1f", g.Bound, want)
	}
	if rounds := time.Duration(cfg.Tasks/cfg.Concurrency) * cfg.Latency; g.Wall < rounds {
		t.Errorf("drained in %s, faster than %d rounds of the model (%s): tasks ran before the drain began", g.Wall, cfg.Tasks/cfg.Concurrency, rounds)
	}
	if g.OverheadP50 <= 0 || g.OverheadP50 > g.P50 {
		t.Errorf("answer to webhook p50 %s, drain start to webhook p50 %s: want a positive share of it", g.OverheadP50, g.P50)
	}
	if g.Ramp <= 0 || g.Tail <= 0 || g.Ramp+g.Tail >= g.Wall {
		t.Errorf("ramp %s and tail %s of a drain of %s: want each positive and both within it", g.Ramp, g.Tail, g.Wall)
	}
	if g.CallTransport <= 0 || g.CallEfficiency() <= g.Efficiency() {
		t.Errorf("a model call costs %s beyond its latency, drain ÷ bound %.3f at the call's latency and %.3f at the model's: want a positive cost, and so a higher share at the call's",
			g.CallTransport, g.CallEfficiency(), g.Efficiency())
	}
	for _, row := range []string{"drain throughput ÷ bound", "ramp: drain start to every slot busy", "tail: last answer to last webhook", "drain ÷ bound at that call latency"} {
		if !strings.Contains(out, row) {
			t.Errorf("report lacks %q:\n%s", row, out)
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"backlog":true`) || !strings.Contains(string(b), `"ramp_seconds":`) {
		t.Errorf("JSON report does not say it is a backlog: %s", b)
	}
}

// The gate holds the worker's messages until the drain begins, and nacks those whose pull
// stops first: a backlog's tasks are all submitted before any is taken.
func TestGatedHoldsMessagesUntilOpened(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var handled atomic.Int64
		gate := make(chan struct{})
		h := gated(bus.HandlerFunc(func(context.Context, *bus.Message) bus.Result { handled.Add(1); return bus.Ack }), gate)
		results := make(chan bus.Result, 3)
		for range 2 {
			go func() { results <- h.Handle(context.Background(), &bus.Message{}) }()
		}
		stopped, stop := context.WithCancel(context.Background())
		go func() { results <- h.Handle(stopped, &bus.Message{}) }()
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := handled.Load(); n != 0 {
			t.Fatalf("%d messages handled before the gate opened", n)
		}
		stop()
		if r := <-results; r != bus.Nack {
			t.Errorf("a message whose pull stopped at the gate: %v, want a nack", r)
		}
		close(gate)
		for range 2 {
			if r := <-results; r != bus.Ack {
				t.Errorf("a message past the open gate: %v, want the handler's ack", r)
			}
		}
		if n := handled.Load(); n != 2 {
			t.Errorf("%d messages handled after the gate opened, want 2", n)
		}
	})
}

func TestInjectorIsAFunctionOfSeedKindKeyAndOccurrence(t *testing.T) {
	t.Parallel()
	a, b, other := newInjector(7), newInjector(7), newInjector(8)
	var da, db, dother []bool
	for i := range 200 {
		key := taskID(i % 20)
		da = append(da, a.fail(failPublish, key, 0.3))
		db = append(db, b.fail(failPublish, key, 0.3))
		dother = append(dother, other.fail(failPublish, key, 0.3))
		if a.fail(failAck, key, 0) {
			t.Fatal("rate 0 failed")
		}
	}
	hits := 0
	for i := range da {
		if da[i] != db[i] {
			t.Fatalf("decision %d differs between two injectors of one seed", i)
		}
		if da[i] {
			hits++
		}
	}
	if hits < 30 || hits > 90 {
		t.Errorf("%d of 200 failed at rate 0.3", hits)
	}
	if a.counts()[failPublish] != hits {
		t.Errorf("counted %d, want %d", a.counts()[failPublish], hits)
	}
	if equal := func() bool {
		for i := range da {
			if da[i] != dother[i] {
				return false
			}
		}
		return true
	}(); equal {
		t.Error("another seed made the same 200 decisions")
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := func(n ...int) []time.Duration {
		var d []time.Duration
		for _, v := range n {
			d = append(d, time.Duration(v)*time.Millisecond)
		}
		return d
	}
	for _, c := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 0.5, 0},
		{ms(5), 0.99, 5 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.99, 4 * time.Millisecond},
		{ms(1, 2, 3, 4), 0, time.Millisecond},
	} {
		if got := percentile(c.in, c.p); got != c.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", c.in, c.p, got, c.want)
		}
	}
}

func TestConfigFlagsAndValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		bad  string // the flag the error names; "" for valid
	}{
		{nil, ""},
		{[]string{"-tasks", "10", "-concurrency", "2", "-baseline", "naive", "-latency-dist", "fixed"}, ""},
		{[]string{"-tasks", "0"}, "--tasks"},
		{[]string{"-concurrency", "0"}, "--concurrency"},
		{[]string{"-latency-dist", "pareto"}, "--latency-dist"},
		{[]string{"-fail-ack", "1"}, "--fail-ack"},
		{[]string{"-fail-model", "-0.1"}, "--fail-model"},
		{[]string{"-baseline", "smart"}, "--baseline"},
		{[]string{"-input-bytes", "0"}, "--input-bytes"},
		{[]string{"-timeout", "0s"}, "--timeout"},
		{[]string{"-mode", "batch"}, ""},
		{[]string{"-mode", "flex", "-shed", "0.2"}, ""},
		{[]string{"-context-cache"}, ""},
		{[]string{"-mode", "later"}, "--mode"},
		{[]string{"-shed", "0.2"}, "--shed"},
		{[]string{"-mode", "flex", "-shed", "1"}, "--shed"},
		{[]string{"-mode", "batch", "-baseline", "naive"}, "--baseline"},
		{[]string{"-mode", "flex", "-context-cache"}, "--context-cache"},
		{[]string{"-backlog", "-tasks", "2000", "-concurrency", "64"}, ""},
		{[]string{"-backlog", "-baseline", "naive"}, "--backlog"},
		{[]string{"-backlog", "-mode", "flex"}, "--backlog"},
		{[]string{"-backlog", "-context-cache"}, "--backlog"},
		{[]string{"-warmup", "0"}, ""},
		{[]string{"-warmup", "-1s"}, "--warmup"},
		{[]string{"-tenants", "bulk:tasks=1000:cap=10,small:tasks=10:cap=10:after=5s:alone", "-instances", "2"}, ""},
		{[]string{"-tenants", "bulk:tasks=10", "-backlog"}, "--tenants"},
		{[]string{"-instances", "2"}, "--instances"},
	} {
		cfg := DefaultConfig()
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		cfg.RegisterFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		err := cfg.Validate()
		switch {
		case c.bad == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.bad != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.bad)):
			t.Errorf("%v: error %v, want one naming %s", c.args, err, c.bad)
		}
	}
}

// BenchmarkEndToEnd runs b.N tasks through genbox and the naive baseline under the default
// failure mix with a 200 ms model, and reports the ratios `genbox bench` prints.
// Run with e.g. -bench EndToEnd -benchtime 100x.
func BenchmarkEndToEnd(b *testing.B) {
	emulator.Require(b)
	cfg := DefaultConfig()
	cfg.Tasks, cfg.Concurrency, cfg.Latency = max(b.N, 8), 16, 200*time.Millisecond
	cfg.Baseline = BaselineNaive
	rep, _ := runLogged(b, cfg)
	g, n := rep.Genbox, *rep.Naive
	b.ReportMetric(g.Efficiency(), "throughput/bound")
	b.ReportMetric(float64(g.OverheadP50.Milliseconds()), "overhead-p50-ms")
	b.ReportMetric(float64(g.OverheadP99.Milliseconds()), "overhead-p99-ms")
	b.ReportMetric(g.PerTask(g.FirestoreReads+g.FirestoreWrites), "firestore-ops/task")
	b.ReportMetric(g.PerTask(g.TotalPublishes()), "publishes/task")
	b.ReportMetric(g.BilledRatio(), "billed/needed")
	b.ReportMetric(n.BilledRatio(), "naive-billed/needed")
	b.ReportMetric(n.Efficiency(), "naive-throughput/bound")
	b.ReportMetric(float64(g.PeakRSS)/(1<<20), "peak-rss-MiB")
}

// The --json report carries the workload and both systems' figures, durations in seconds, and
// the ratios the table prints.
func TestReportJSON(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Progress, cfg.Getenv = &bytes.Buffer{}, func(string) string { return "" } // not part of the report
	g := Result{System: "genbox", Tasks: 10, Completed: 10, Throughput: 4, Bound: 5, P99: 1500 * time.Millisecond,
		BilledTokens: 300, NeededTokens: 300, Publishes: map[string]int{"gemini-tasks": 12}}
	n := Result{System: "naive", Tasks: 10, Completed: 9, Lost: 1, BilledTokens: 450, NeededTokens: 270}
	b, err := json.Marshal(Report{Config: cfg, Warmup: Warmup{Tasks: 2000, Elapsed: 30 * time.Second, Rounds: []float64{120, 240}}, Genbox: g, Naive: &n, Elapsed: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Workload struct {
			Tasks         int                `json:"tasks"`
			Latency       float64            `json:"latency_seconds"`
			Failures      map[string]float64 `json:"failures"`
			WarmupSeconds float64            `json:"warmup_seconds"`
			WarmupTasks   int                `json:"warmup_tasks"`
			WarmupRounds  []float64          `json:"warmup_rounds"`
		} `json:"workload"`
		Systems []map[string]any `json:"systems"`
		Elapsed float64          `json:"elapsed_seconds"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	if got.Workload.Tasks != cfg.Tasks || got.Workload.Latency != cfg.Latency.Seconds() || got.Workload.Failures[failModel] != cfg.ModelErrors || got.Elapsed != 3 ||
		got.Workload.WarmupSeconds != 30 || got.Workload.WarmupTasks != 2000 || !slices.Equal(got.Workload.WarmupRounds, []float64{120, 240}) {
		t.Errorf("workload %+v elapsed %v, want the config's, 3 s and the warm-up's 2000 tasks in 30 s, rounds of 120 and 240 tasks/s", got.Workload, got.Elapsed)
	}
	if len(got.Systems) != 2 {
		t.Fatalf("systems %v, want genbox and naive", got.Systems)
	}
	for key, want := range map[string]any{"system": "genbox", "efficiency": 0.8, "p99_seconds": 1.5, "billed_ratio": 1.0} {
		if got.Systems[0][key] != want {
			t.Errorf("genbox %s = %v, want %v", key, got.Systems[0][key], want)
		}
	}
	if got.Systems[1]["system"] != "naive" || got.Systems[1]["lost"] != 1.0 {
		t.Errorf("naive %v", got.Systems[1])
	}
}

// With nothing failing, a task's whole path — submit, claim, output commit, delivery — costs at
// most 3 Firestore reads and 4 writes (issue #20): the delivery claim is folded into the output
// commit, the commit and the delivery record start from the task their claim wrote or read, and
// the tenant's limits and secrets are read once per refresh, not per task. Counts, not timings:
// they do not depend on the machine's speed.
func TestPathOperationsPerTask(t *testing.T) {
	t.Parallel()
	cfg := small(t)
	cfg.Tasks, cfg.Concurrency, cfg.Distribution, cfg.Baseline = 40, 8, DistFixed, BaselineNone
	cfg.ModelErrors, cfg.ResultLoss, cfg.AckLoss, cfg.WebhookErrors = 0, 0, 0, 0
	rep, _ := runLogged(t, cfg)
	g := rep.Genbox
	if g.Completed != cfg.Tasks {
		t.Fatalf("completed %d of %d", g.Completed, cfg.Tasks)
	}
	p := g.PathOps()
	if reads := g.PerTask(p.Reads); reads > 3 {
		t.Errorf("%.2f Firestore reads per task on the path, want at most 3 (by step: %+v)", reads, g.Ops)
	}
	if writes := g.PerTask(p.Writes); writes > 4 {
		t.Errorf("%.2f Firestore writes per task on the path, want at most 4 (by step: %+v)", writes, g.Ops)
	}
	for _, step := range []string{stepSubmit, stepClaim, stepCommit, stepDeliveryClaim, stepRecord} {
		if !slices.ContainsFunc(g.Ops, func(s StepOps) bool { return s.Step == step }) {
			t.Errorf("no operations counted for step %q: %+v", step, g.Ops)
		}
	}
	if len(g.Steps) != len(overheadSteps) {
		t.Errorf("overhead broken down into %d steps, want %d: %+v", len(g.Steps), len(overheadSteps), g.Steps)
	}
}

// A warm-up puts its tasks through the emulators before the timed run, in projects of its own:
// the report says so, and the run's figures count only the run's tasks.
func TestWarmUpRunsFirstAndApart(t *testing.T) {
	t.Parallel()
	cfg := small(t)
	cfg.Tasks, cfg.Baseline, cfg.Warmup = 8, BaselineNone, time.Nanosecond
	cfg.ModelErrors, cfg.ResultLoss, cfg.AckLoss, cfg.WebhookErrors = 0, 0, 0, 0
	var bar bytes.Buffer
	cfg.Progress = &bar
	rep, out := runLogged(t, cfg)
	if rep.Warmup.Tasks != warmupConcurrency || rep.Warmup.Elapsed <= 0 || len(rep.Warmup.Rounds) != 1 || rep.Warmup.Rounds[0] <= 0 {
		t.Errorf("warm-up %+v, want one round of %d tasks", rep.Warmup, warmupConcurrency)
	}
	if want := fmt.Sprintf("warm-up: %d tasks", warmupConcurrency); !strings.Contains(out, want) || !strings.Contains(bar.String(), "--warmup 0 skips") {
		t.Errorf("report lacks %q, or progress lacks the warm-up:\n%s\n%s", want, out, bar.String())
	}
	g := rep.Genbox
	if g.Completed != cfg.Tasks || g.ModelCalls != cfg.Tasks || g.Webhooks != cfg.Tasks {
		t.Errorf("run completed %d, called the model %d times, delivered %d webhooks: want %d each, the warm-up's apart", g.Completed, g.ModelCalls, g.Webhooks, cfg.Tasks)
	}
}

// The warm-up goes on while its rounds get faster, through one slow round, and ends after two
// rounds in a row that do not beat the best before them by 5 %: a fresh emulator pair's
// measured rounds keep it going, a warm pair's end it at the third round.
func TestWarmingEndsWhenTheRoundsStopGettingFaster(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		rounds []float64
		want   int // rounds run
	}{
		{"fresh pair", []float64{74, 130, 154, 175, 184, 200, 216, 203, 240, 223}, 10},
		{"warm pair", []float64{221, 218, 226, 240}, 3},
		{"one slow round", []float64{100, 90, 120, 118, 119, 130}, 5},
	} {
		var w warming
		ran := 0
		for _, r := range c.rounds {
			ran++
			if !w.add(r) {
				break
			}
		}
		if ran != c.want {
			t.Errorf("%s: %d rounds of %v, want %d", c.name, ran, c.rounds, c.want)
		}
	}
}
