package bench

import (
	"math"
	"strings"
	"testing"

	"github.com/genbox-dev/genbox/internal/emulator"
)

// savingsConfig is a savings workload short enough for CI, under the default failure mix.
func savingsConfig(t *testing.T, tasks int) Config {
	t.Helper()
	emulator.Require(t)
	c := DefaultConfig()
	c.Tasks, c.Concurrency = tasks, 8
	c.Project = "bench-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))[:min(len(t.Name()), 12)]
	return c
}

// Batch and flex (with a fifth of the flex requests shed) each cost at most about half the
// standard run per task, pay for every generation once and lose nothing.
func TestSavingsOfBatchAndFlex(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode     string
		shed     float64
		maxRatio float64
	}{{ModeBatch, 0, 0.52}, {ModeFlex, 0.2, 0.55}} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			cfg := savingsConfig(t, 24)
			cfg.Mode, cfg.Shed = tc.mode, tc.shed
			rep, out := runLogged(t, cfg)
			sv := rep.Savings
			if sv.Base.Lost+sv.Run.Lost != 0 || sv.Run.Completed != cfg.Tasks {
				t.Errorf("lost %d + %d, completed %d of %d", sv.Base.Lost, sv.Run.Lost, sv.Run.Completed, cfg.Tasks)
			}
			if r := sv.Ratio(); r > tc.maxRatio || r <= 0 {
				t.Errorf("cost per task ÷ standard's = %.3f, want at most %.2f", r, tc.maxRatio)
			}
			if sv.Run.BilledRatio() != 1 || sv.Base.BilledRatio() != 1 {
				t.Errorf("billed ÷ needed %.3f (%s), %.3f (standard)", sv.Run.BilledRatio(), tc.mode, sv.Base.BilledRatio())
			}
			if tc.mode == ModeBatch && sv.Run.BatchJobs == 0 {
				t.Error("the batch run ran no batch job")
			}
			if !strings.Contains(out, "cost per task ÷ the online (standard) run's") {
				t.Errorf("report lacks the ratio line:\n%s", out)
			}
		})
	}
}

// Seed 000's shape with caching on costs less than with it off, storage included, within 5%
// of the break-even rule's prediction; the cold family gets no cache.
func TestSavingsOfContextCaching(t *testing.T) {
	t.Parallel()
	cfg := savingsConfig(t, 40)
	// Two at a time: the calls that start while the cache is created go uncached, and with 40
	// tasks each is worth about half a percent of the ratio.
	cfg.ContextCache, cfg.Concurrency = true, 2
	rep, _ := runLogged(t, cfg)
	sv := rep.Savings
	if sv.Base.Lost+sv.Run.Lost != 0 {
		t.Errorf("lost %d + %d", sv.Base.Lost, sv.Run.Lost)
	}
	r := sv.Ratio()
	if r >= 1 || sv.Predicted <= 0 || math.Abs(r-sv.Predicted)/sv.Predicted > 0.05 {
		t.Errorf("cost ratio %.3f, predicted %.3f: want below 1 and within 5%%", r, sv.Predicted)
	}
	if sv.HotCaches != 1 || sv.ColdCaches != 0 || len(sv.Base.Caches) != 0 {
		t.Errorf("caches: hot %d, cold %d, with caching off %d; want one for the hot family alone", sv.HotCaches, sv.ColdCaches, len(sv.Base.Caches))
	}
}

// Batch mode with 100 tasks that each read a file: every task reads its file through one Files
// API copy made before its batch, the batch costs at most about half the standard run per task,
// and nothing is lost.
func TestSavingsOfBatchWithFiles(t *testing.T) {
	t.Parallel()
	cfg := savingsConfig(t, 100)
	cfg.Mode, cfg.FileBytes = ModeBatch, 20000
	rep, _ := runLogged(t, cfg)
	sv := rep.Savings
	if sv.Base.Lost+sv.Run.Lost != 0 || sv.Run.Completed != cfg.Tasks {
		t.Errorf("lost %d + %d, completed %d of %d", sv.Base.Lost, sv.Run.Lost, sv.Run.Completed, cfg.Tasks)
	}
	if r := sv.Ratio(); r > 0.52 || r <= 0 {
		t.Errorf("cost per task ÷ standard's = %.3f, want at most 0.52", r)
	}
	if sv.Run.BatchJobs == 0 || sv.Run.FileReads < cfg.Tasks || sv.Run.FileCopies != cfg.Tasks {
		t.Errorf("batch run: %d jobs, %d generations read a file, %d Files API copies; want jobs, every task's file read, one copy each",
			sv.Run.BatchJobs, sv.Run.FileReads, sv.Run.FileCopies)
	}
}
