package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// TenantLoad is one tenant of a multi-tenant run (--tenants): its backlog, its limits and when
// its tasks arrive.
type TenantLoad struct {
	Name  string
	Tasks int // tasks submitted in all
	Cap   int // its concurrency limit; 0: none
	// Weight is its part of the pool's slots when the tenants contend for them; 0: 1.
	Weight int
	// After is when its tasks are submitted, after the drain starts; 0: queued before it, with
	// every other tenant's backlog.
	After time.Duration
	// Urgent, when positive, submits one more task of the highest priority this long after the
	// drain starts, behind the tenant's backlog: the report says how long after a slot of the
	// tenant freed it started.
	Urgent time.Duration
	// Alone runs the tenant's workload again by itself after the run, for its latency alone.
	Alone bool
}

// ParseTenants reads --tenants: tenants separated by commas, each a name followed by
// colon-separated settings — tasks=N, cap=N, weight=N, after=DURATION, urgent=DURATION, alone —
// e.g. "bulk:tasks=1000:cap=10,small:tasks=10:cap=10:after=5s:alone".
func ParseTenants(s string) ([]TenantLoad, error) {
	if s == "" {
		return nil, nil
	}
	var out []TenantLoad
	for spec := range strings.SplitSeq(s, ",") {
		parts := strings.Split(strings.TrimSpace(spec), ":")
		t := TenantLoad{Name: parts[0], Tasks: 1}
		if t.Name == "" || slices.ContainsFunc(out, func(o TenantLoad) bool { return o.Name == t.Name }) {
			return nil, fmt.Errorf("%w: --tenants: %q needs a name of its own", ErrConfig, spec)
		}
		for _, kv := range parts[1:] {
			k, v, _ := strings.Cut(kv, "=")
			var err error
			switch k {
			case "tasks":
				t.Tasks, err = strconv.Atoi(v)
			case "cap":
				t.Cap, err = strconv.Atoi(v)
			case "weight":
				t.Weight, err = strconv.Atoi(v)
			case "after":
				t.After, err = time.ParseDuration(v)
			case "urgent":
				t.Urgent, err = time.ParseDuration(v)
			case "alone":
				t.Alone = true
			default:
				err = errors.New("unknown setting")
			}
			if err != nil {
				return nil, fmt.Errorf("%w: --tenants: %s of %s: %w", ErrConfig, kv, t.Name, err)
			}
		}
		if t.Tasks < 1 || t.Cap < 0 || t.Weight < 0 || t.After < 0 || t.Urgent < 0 {
			return nil, fmt.Errorf("%w: --tenants: %s needs tasks >= 1 and cap, weight, after, urgent >= 0", ErrConfig, t.Name)
		}
		out = append(out, t)
	}
	return out, nil
}

// tenantCalls counts each tenant's calls at the fake, as the fake holds them: from its latency
// draw until that latency has passed. Safe for concurrent use; a nil one counts nothing.
type tenantCalls struct {
	mu       sync.Mutex
	tenantOf map[string]string // task id -> tenant
	now, max map[string]int
	spans    map[string][]span // each call, as the fake held it
}

func newTenantCalls() *tenantCalls {
	return &tenantCalls{tenantOf: map[string]string{}, now: map[string]int{}, max: map[string]int{}, spans: map[string][]span{}}
}

func (c *tenantCalls) assign(id, tenant string) {
	c.mu.Lock()
	c.tenantOf[id] = tenant
	c.mu.Unlock()
}

func (c *tenantCalls) start(id string, d time.Duration) {
	if c == nil {
		return
	}
	c.mu.Lock()
	tenant := c.tenantOf[id]
	c.now[tenant]++
	c.max[tenant] = max(c.max[tenant], c.now[tenant])
	now := time.Now()
	c.spans[tenant] = append(c.spans[tenant], span{start: now, end: now.Add(d)})
	c.mu.Unlock()
	time.AfterFunc(d, func() {
		c.mu.Lock()
		c.now[tenant]--
		c.mu.Unlock()
	})
}

func (c *tenantCalls) peak(tenant string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.max[tenant]
}

// createTenants creates the run's tenants with their caps, signing with the receiver's secret.
func (s *stack) createTenants(ctx context.Context) error {
	for _, t := range s.cfg.Tenants {
		limits := store.DefaultLimits()
		limits.Concurrency, limits.Weight, limits.SubmitRate, limits.SubmitBurst = t.Cap, t.Weight, 0, 0
		if _, err := s.store.CreateTenant(ctx, t.Name, limits, s.secret); err != nil {
			return err
		}
	}
	return nil
}

// TenantResult is what one tenant of a multi-tenant run got.
type TenantResult struct {
	TenantLoad
	Completed, Lost int
	// Throughput is its completed tasks ÷ the time from its first submission (or the drain's
	// start, for a backlog) to its last webhook; Bound is the most it could get: its cap, else
	// every slot, ÷ the mean model latency.
	Throughput, Bound float64
	// P50 and P99 run from each task's submission (a backlog's: the drain's start) to its webhook.
	P50, P99 time.Duration
	// PeakCalls is the most calls of the tenant the fake held at once.
	PeakCalls int
	// UrgentStart is how long after one of the tenant's calls ended (a slot freed) its urgent
	// task's call started; negative when none had ended since its submission.
	UrgentStart time.Duration
	// AloneP50 is its P50 run by itself (Alone), 0 when not run.
	AloneP50 time.Duration
}

// Ratio is throughput ÷ bound.
func (r TenantResult) Ratio() float64 {
	if r.Bound == 0 {
		return 0
	}
	return r.Throughput / r.Bound
}

// TenantsReport is a multi-tenant run's outcome.
type TenantsReport struct {
	Config  Config
	Warmup  Warmup
	Tenants []TenantResult
	// Run is the run as a whole: Firestore operations per task, billing, duplicates.
	Run Result
	// Shares is how the backlogs divided the slots, when two or more were queued at the start.
	Shares *Shares
}

// runTenants runs cfg.Tenants through genbox and, for those that ask, each alone.
func runTenants(ctx context.Context, cfg Config, emu *emulator.Emulators, suffix string) (TenantsReport, error) {
	rep := TenantsReport{Config: cfg}
	var err error
	if rep.Warmup, err = warmUp(ctx, cfg, emu, suffix); err != nil {
		return rep, err
	}
	if rep.Tenants, rep.Run, rep.Shares, err = runTenantsOnce(ctx, cfg, emu, cfg.Project+"-tenants"+suffix); err != nil {
		return rep, err
	}
	for i, t := range rep.Tenants {
		if !t.Alone {
			continue
		}
		alone := cfg
		alone.Tenants = []TenantLoad{t.TenantLoad}
		alone.Tenants[0].After = 0
		res, _, _, err := runTenantsOnce(ctx, alone, emu, fmt.Sprintf("%s-alone%d%s", cfg.Project, i, suffix))
		if err != nil {
			return rep, fmt.Errorf("%s alone: %w", t.Name, err)
		}
		rep.Tenants[i].AloneP50 = res[0].P50
	}
	return rep, nil
}

// tenantTask is one task of a multi-tenant run.
type tenantTask struct {
	id, tenant string
	urgent     bool
	submitted  time.Time // zero for a backlog's task: it counts from the drain's start
}

// runTenantsOnce runs cfg.Tenants once in project, and measures the slots' shares when two or
// more backlogs were queued at the start.
func runTenantsOnce(ctx context.Context, cfg Config, emu *emulator.Emulators, project string) ([]TenantResult, Result, *Shares, error) {
	s, err := newStack(cfg)
	if err != nil {
		return nil, Result{}, nil, err
	}
	defer s.close()
	s.lat.calls = newTenantCalls()
	if err := s.startGenbox(ctx, emu, project); err != nil {
		return nil, Result{}, nil, err
	}
	var tasks []*tenantTask
	for _, t := range cfg.Tenants {
		for range t.Tasks {
			tasks = append(tasks, &tenantTask{id: taskID(len(tasks)), tenant: t.Name})
		}
		if t.Urgent > 0 {
			tasks = append(tasks, &tenantTask{id: taskID(len(tasks)), tenant: t.Name, urgent: true})
		}
	}
	arrived := map[string]<-chan struct{}{}
	for _, tt := range tasks {
		s.lat.calls.assign(tt.id, tt.tenant)
		arrived[tt.id] = s.recv.Delivered(task.EventID(tt.id, task.EventSucceeded, 0))
	}
	when := func(tt *tenantTask) time.Duration {
		i := slices.IndexFunc(cfg.Tenants, func(t TenantLoad) bool { return t.Name == tt.tenant })
		if tt.urgent {
			return cfg.Tenants[i].Urgent
		}
		return cfg.Tenants[i].After
	}
	submit := func(batch []*tenantTask) error {
		ids := make(chan *tenantTask)
		errs := make(chan error, backlogSubmitters)
		for range backlogSubmitters {
			go func() {
				var err error
				for tt := range ids {
					if err != nil {
						continue
					}
					priority := task.DefaultPriority
					if tt.urgent {
						priority = task.MaxPriority
					}
					if when(tt) > 0 {
						tt.submitted = time.Now()
					}
					err = s.submitAs(ctx, tt.tenant, tt.id, backlogGrace, priority)
				}
				errs <- err
			}()
		}
		for _, tt := range batch {
			ids <- tt
		}
		close(ids)
		var all []error
		for range backlogSubmitters {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}
	var first []*tenantTask
	later := map[time.Duration][]*tenantTask{}
	for _, tt := range tasks {
		if d := when(tt); d > 0 {
			later[d] = append(later[d], tt)
		} else {
			first = append(first, tt)
		}
	}
	ops0, steps0 := s.counter.Counts(), s.counter.ByStep()
	if err := submit(first); err != nil {
		return nil, Result{}, nil, fmt.Errorf("submit: %w", err)
	}
	bar := startProgress(cfg.Progress, "tenants", len(tasks))
	defer bar.stop()
	start := time.Now()
	close(s.gate)
	var wg sync.WaitGroup
	var lateErr error
	var errMu sync.Mutex
	for d, batch := range later {
		wg.Go(func() {
			time.Sleep(time.Until(start.Add(d)))
			if err := submit(batch); err != nil {
				errMu.Lock()
				lateErr = errors.Join(lateErr, err)
				errMu.Unlock()
			}
		})
	}
	deadline := time.NewTimer(cfg.Timeout)
	defer deadline.Stop()
	timedOut := false
	for _, tt := range tasks {
		select {
		case <-arrived[tt.id]:
			bar.add()
		case <-deadline.C:
			timedOut = true
		case <-ctx.Done():
			return nil, Result{}, nil, ctx.Err()
		}
		if timedOut {
			break
		}
	}
	wg.Wait()
	if lateErr != nil {
		return nil, Result{}, nil, fmt.Errorf("submit: %w", lateErr)
	}
	time.Sleep(time.Second + 2*cfg.Latency)
	if err := s.stopSystem(ctx); err != nil {
		return nil, Result{}, nil, err
	}
	idle, cancel := context.WithTimeout(ctx, 5*cfg.Latency+10*time.Second)
	defer cancel()
	if err := s.fake.WaitIdle(idle); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, Result{}, nil, err
	}

	run := Result{System: systemGenbox, Tasks: len(tasks), Publishes: s.pubs.counts()}
	ops := s.counter.Counts().Sub(ops0)
	run.FirestoreReads, run.FirestoreWrites, run.FirestoreCommits = ops.Reads, ops.Writes, ops.Commits
	run.Ops = stepOps(s.counter.ByStep(), steps0)
	var out []TenantResult
	for _, t := range cfg.Tenants {
		tr := TenantResult{TenantLoad: t, PeakCalls: s.lat.calls.peak(t.Name), UrgentStart: -1}
		var e2e []time.Duration
		var modelSum time.Duration
		begin, last := start, start
		if t.After > 0 {
			begin = start.Add(t.After)
		}
		for _, tt := range tasks {
			if tt.tenant != t.Name {
				continue
			}
			got := s.recv.Deliveries(task.EventID(tt.id, task.EventSucceeded, 0))
			if len(got) == 0 {
				tr.Lost++
				continue
			}
			at := got[0].At
			from := start
			if !tt.submitted.IsZero() {
				from = tt.submitted
			}
			if tt.urgent {
				tr.UrgentStart = urgentStart(s, tasks, tt)
			}
			tr.Completed++
			e2e = append(e2e, at.Sub(from))
			if at.After(last) {
				last = at
			}
			m, _ := s.lat.get(tt.id)
			modelSum += m
		}
		run.Completed += tr.Completed
		run.Lost += tr.Lost
		e2e = sortedCopy(e2e)
		tr.P50, tr.P99 = percentile(e2e, 0.5), percentile(e2e, 0.99)
		if tr.Completed > 0 && last.After(begin) {
			tr.Throughput = float64(tr.Completed) / last.Sub(begin).Seconds()
			mean := modelSum / time.Duration(tr.Completed)
			slots := cfg.Concurrency * max(cfg.Instances, 1)
			if t.Cap > 0 {
				slots = min(slots, t.Cap)
			}
			tr.Bound = float64(slots) / mean.Seconds()
		}
		out = append(out, tr)
	}
	led := s.fake.Ledger()
	run.ModelCalls, run.Generations = led.Total.Calls, led.Total.Generations
	run.BilledTokens, run.NeededTokens = led.Total.Billed.TotalTokens, neededTokens(led)
	run.Webhooks, run.Duplicates, _ = s.recv.Tally()
	var sh *Shares
	if m, ok := measureShares(cfg, s.lat.calls, start); ok {
		sh = &m
	}
	return out, run, sh, nil
}

// urgentStart is how long after the first call of its tenant that ended after its submission
// (the first slot of the tenant to free) the urgent task tt's call started; -1 when none ended.
func urgentStart(s *stack, tasks []*tenantTask, tt *tenantTask) time.Duration {
	end, ok := s.lat.answered(tt.id)
	if !ok {
		return -1
	}
	d, _ := s.lat.get(tt.id)
	began := end.Add(-d)
	var freed time.Time
	for _, o := range tasks {
		if o.tenant != tt.tenant || o == tt {
			continue
		}
		end, ok := s.lat.answered(o.id)
		if ok && end.After(tt.submitted) && (freed.IsZero() || end.Before(freed)) {
			freed = end
		}
	}
	if freed.IsZero() {
		return -1
	}
	return began.Sub(freed)
}

// Print writes the multi-tenant report: a row per tenant, then the run's Firestore operations.
func (r TenantsReport) Print(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "workload: %d tenants on %d worker instance(s) of %d model-call slots, model latency %s (%s), input %d B\n",
		len(c.Tenants), max(c.Instances, 1), c.Concurrency, c.Latency, c.Distribution, c.InputBytes)
	fmt.Fprintf(w, "%s\n\n", r.Warmup)
	fmt.Fprintf(w, "%-10s %6s %4s %8s %10s %8s %7s %9s %9s %6s %10s %10s\n",
		"tenant", "tasks", "cap", "after", "tasks/s", "bound", "÷bound", "p50", "p99", "peak", "urgent", "p50÷alone")
	for _, t := range r.Tenants {
		urgent, alone, tasks := "", "", t.Tasks
		if t.Urgent > 0 {
			urgent, tasks = dur(t.UrgentStart), tasks+1
		}
		if t.AloneP50 > 0 {
			alone = fmt.Sprintf("%.2f", t.P50.Seconds()/t.AloneP50.Seconds())
		}
		fmt.Fprintf(w, "%-10s %6s %4d %8s %10.1f %8.1f %7.3f %9s %9s %6d %10s %10s\n",
			t.Name, fmt.Sprintf("%d/%d", t.Completed, tasks), t.Cap, dur(t.After), t.Throughput, t.Bound, t.Ratio(),
			dur(t.P50), dur(t.P99), t.PeakCalls, urgent, alone)
	}
	if r.Shares != nil {
		r.Shares.print(w, c.Tenants)
	}
	run := r.Run
	p := run.PathOps()
	fmt.Fprintf(w, "\nFirestore per task: %.2f reads, %.2f writes on the path (%.2f / %.2f in all); billed ÷ needed %.3f; %d lost, %d duplicate webhooks\n",
		run.PerTask(p.Reads), run.PerTask(p.Writes), run.PerTask(run.FirestoreReads), run.PerTask(run.FirestoreWrites),
		run.BilledRatio(), run.Lost, run.Duplicates)
	printSteps(w, run)
}
