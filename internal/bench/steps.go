package bench

import (
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/fscount"
)

// The steps of a task's path that Firestore operations are counted under: each is named after the
// genbox function that makes the call (the innermost one of the table that is on the stack).
const (
	stepSubmit        = "submit"          // the publisher's task write
	stepClaim         = "claim"           // the worker's claim
	stepRenew         = "lease renewal"   // the worker's lease renewals during the call
	stepTenant        = "tenant limits"   // the worker's reads of the tenant's limits
	stepFileCopy      = "file copy"       // the worker's record of a file's Files API copy
	stepCommit        = "output commit"   // the worker's output commit
	stepRemember      = "cache entry"     // the worker's cache entry and last good output
	stepDeliveryClaim = "delivery claim"  // the resulthandler's delivery claim
	stepSecrets       = "webhook secrets" // the resulthandler's read of the tenant's secrets
	stepRecord        = "delivery record" // the resulthandler's record of the outcome
	stepSweeper       = "sweeper"         // the sweeper's queries and nudge writes
	stepSlots         = "tenant slots"    // the worker's reads of a tenant's slot count and waiting tasks
)

// stepFuncs maps a function, as runtime.Frame names it without the module path, to its step.
var stepFuncs = []struct{ fn, step string }{
	{"internal/bench.(*stack).submit", stepSubmit},
	{"internal/worker.(*Handler).claim", stepClaim},
	{"internal/worker.(*Handler).renew", stepRenew},
	{"internal/worker.(*TenantCache).Limits", stepTenant},
	{"internal/worker.(*run).copyFile", stepFileCopy},
	{"internal/worker.(*Handler).remember", stepRemember},
	{"internal/worker.(*run).persist", stepCommit},
	{"internal/resulthandler.(*Handler).claim", stepDeliveryClaim},
	{"internal/store.(*Store).WebhookSecrets", stepSecrets},
	{"internal/resulthandler.(*Handler).record", stepRecord},
	{"internal/sweeper.", stepSweeper},
	{"internal/store.(*Store).GetSlotCount", stepSlots},
	{"internal/store.(*Store).AwaitingSlot", stepSlots},
}

// stepOrder is the order the report lists the steps in; what no entry of stepFuncs names comes
// after them, named by the innermost genbox function outside the store on its stack.
var stepOrder = []string{stepSubmit, stepClaim, stepTenant, stepFileCopy, stepSlots, stepRenew, stepCommit, stepRemember, stepDeliveryClaim, stepSecrets, stepRecord, stepSweeper}

const module = "github.com/genbox-dev/genbox/"

// callerStep names the step of the calling goroutine's Firestore call from its stack
// (fscount.Counter.Step).
func callerStep() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	other := ""
	for {
		f, more := frames.Next()
		if fn, ok := strings.CutPrefix(f.Function, module); ok {
			for _, s := range stepFuncs {
				if strings.HasPrefix(fn, s.fn) {
					return s.step
				}
			}
			if other == "" && !strings.HasPrefix(fn, "internal/store.") && !strings.HasPrefix(fn, "internal/fscount.") {
				other = "other: " + fn
			}
		}
		if !more {
			break
		}
	}
	if other == "" {
		return "other"
	}
	return other
}

// Marks on a task's timeline, in the order of its path.
const (
	markSubmitted  = iota // the bench submitted it
	markClaimed           // the worker's claim returned
	markModelStart        // the fake model received the call
	markModelEnd          // the fake model answered (its start plus the latency drawn)
	markCommitted         // the worker's output commit returned
	markPublished         // the worker published its gemini-results nudge
	markDelivered         // the receiver got the first verified webhook
	numMarks
)

// Steps of the overhead: the time between two marks, the model's own latency excluded.
var overheadSteps = []struct {
	name     string
	from, to int
}{
	{"submit → claimed", markSubmitted, markClaimed},
	{"claimed → model start", markClaimed, markModelStart},
	{"model end → output committed", markModelEnd, markCommitted},
	{"committed → result published", markCommitted, markPublished},
	{"published → delivered", markPublished, markDelivered},
}

// timeline records, per task, the first time each mark was reached. Safe for concurrent use.
type timeline struct {
	mu sync.Mutex
	at map[string]*[numMarks]time.Time
}

func newTimeline() *timeline { return &timeline{at: map[string]*[numMarks]time.Time{}} }

// mark records that task id reached mark at t, unless it already had.
func (l *timeline) mark(id string, mark int, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.at[id]
	if !ok {
		m = new([numMarks]time.Time)
		l.at[id] = m
	}
	if m[mark].IsZero() {
		m[mark] = t
	}
}

// warm reports which tasks were submitted after the first webhook of the run had arrived: the
// stack had then carried a task through every step once (its connections and streams open, its
// caches read, the emulators past their first requests), so what follows is its steady state.
func (l *timeline) warm() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for _, m := range l.at {
		if d := m[markDelivered]; !d.IsZero() && (first.IsZero() || d.Before(first)) {
			first = d
		}
	}
	out := map[string]bool{}
	for id, m := range l.at {
		if !first.IsZero() && !m[markSubmitted].Before(first) {
			out[id] = true
		}
	}
	return out
}

// onWrite marks the task writes of the steps that end a mark (fscount.Counter.OnWrite).
func (l *timeline) onWrite(step string, at time.Time, docs []string) {
	var mark int
	switch step {
	case stepClaim:
		mark = markClaimed
	case stepCommit:
		mark = markCommitted
	default:
		return
	}
	for _, id := range docs {
		if taskIDRE.MatchString(id) {
			l.mark(id, mark, at)
		}
	}
}

// StepOps are the Firestore operations of one step of the path.
type StepOps struct {
	Step string
	fscount.Counts
}

// StepLatency is one step's share of the overhead: its p50 and p99 over the tasks, and its mean
// over the slowest 1 % of them by overhead (what the tail is made of).
type StepLatency struct {
	Step     string
	P50, P99 time.Duration
	TailMean time.Duration
}

// PathOps sums the operations of the steps of a task's path, submit to delivered: every step
// but the sweeper's and what no step names (leader leases, spend flushes), which a run pays by
// the second, not by the task.
func (r Result) PathOps() fscount.Counts {
	var sum fscount.Counts
	for _, s := range r.Ops {
		if s.Step != stepSweeper && slices.Contains(stepOrder, s.Step) {
			sum = fscount.Counts{Reads: sum.Reads + s.Reads, Writes: sum.Writes + s.Writes, Commits: sum.Commits + s.Commits}
		}
	}
	return sum
}

// stepOps orders the per-step counts as the report lists them.
func stepOps(by map[string]fscount.Counts, base map[string]fscount.Counts) []StepOps {
	var out []StepOps
	names := slices.Sorted(maps.Keys(by))
	slices.SortStableFunc(names, func(a, b string) int { return rank(a) - rank(b) })
	for _, n := range names {
		c := by[n].Sub(base[n])
		if c != (fscount.Counts{}) {
			out = append(out, StepOps{Step: n, Counts: c})
		}
	}
	return out
}

func rank(step string) int {
	if i := slices.Index(stepOrder, step); i >= 0 {
		return i
	}
	return len(stepOrder)
}

// stepLatencies breaks the overhead of the tasks ids down by step; over is each task's overhead,
// by id. A task missing a mark of a step (its claim was not counted, say) is left out of that
// step.
func (l *timeline) stepLatencies(over map[string]time.Duration) []StepLatency {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := slices.Collect(maps.Keys(over))
	slices.SortFunc(ids, func(a, b string) int { return int(over[b] - over[a]) })
	tail := ids[:(len(ids)+99)/100]
	out := make([]StepLatency, 0, len(overheadSteps))
	for _, s := range overheadSteps {
		var all []time.Duration
		var tailSum time.Duration
		var tailN int
		for i, id := range ids {
			m, ok := l.at[id]
			if !ok || m[s.from].IsZero() || m[s.to].IsZero() {
				continue
			}
			d := m[s.to].Sub(m[s.from])
			all = append(all, d)
			if i < len(tail) {
				tailSum += d
				tailN++
			}
		}
		if len(all) == 0 {
			continue
		}
		all = sortedCopy(all)
		sl := StepLatency{Step: s.name, P50: percentile(all, 0.5), P99: percentile(all, 0.99)}
		if tailN > 0 {
			sl.TailMean = tailSum / time.Duration(tailN)
		}
		out = append(out, sl)
	}
	return out
}

// printSteps writes a result's per-step breakdowns: Firestore operations per task and the
// overhead's quantiles.
func printSteps(w io.Writer, r Result) {
	if len(r.Ops) > 0 {
		fmt.Fprintf(w, "\n%s: Firestore operations per task, by step\n", r.System)
		fmt.Fprintf(w, "  %-44s %8s %8s %8s\n", "step", "reads", "writes", "commits")
		for _, s := range r.Ops {
			fmt.Fprintf(w, "  %-44s %8.2f %8.2f %8.2f\n", s.Step, r.PerTask(s.Reads), r.PerTask(s.Writes), r.PerTask(s.Commits))
		}
		p := r.PathOps()
		fmt.Fprintf(w, "  %-44s %8.2f %8.2f %8.2f\n", "the path, submit to delivered", r.PerTask(p.Reads), r.PerTask(p.Writes), r.PerTask(p.Commits))
	}
	if len(r.Steps) > 0 {
		fmt.Fprintf(w, "\n%s: overhead by step\n", r.System)
		fmt.Fprintf(w, "  %-44s %8s %8s %14s\n", "step", "p50", "p99", "slowest 1 %")
		for _, s := range r.Steps {
			fmt.Fprintf(w, "  %-44s %8s %8s %14s\n", s.Step, dur(s.P50), dur(s.P99), dur(s.TailMean))
		}
	}
}
