package bench

import (
	"encoding/json"
	"time"
)

// reportJSON is the report as `genbox bench --json` prints it.
type reportJSON struct {
	Workload       workloadJSON `json:"workload"`
	Systems        []resultJSON `json:"systems"` // genbox, then the baseline when it ran
	Tenants        []tenantJSON `json:"tenants,omitempty"`
	ElapsedSeconds float64      `json:"elapsed_seconds"`
}

// tenantJSON is one tenant of a multi-tenant run (--tenants); Systems then holds the run as a
// whole.
type tenantJSON struct {
	Name               string  `json:"name"`
	Tasks              int     `json:"tasks"`
	Cap                int     `json:"cap"`
	Weight             int     `json:"weight,omitempty"`
	AfterSeconds       float64 `json:"after_seconds"`
	Completed          int     `json:"completed"`
	Lost               int     `json:"lost"`
	Throughput         float64 `json:"throughput"`
	Bound              float64 `json:"bound"`
	Ratio              float64 `json:"throughput_over_bound"`
	P50Seconds         float64 `json:"p50_seconds"`
	P99Seconds         float64 `json:"p99_seconds"`
	PeakCalls          int     `json:"peak_calls"`
	UrgentStartSeconds float64 `json:"urgent_start_seconds,omitempty"`
	AloneP50Seconds    float64 `json:"alone_p50_seconds,omitempty"`
	// Share is its part of the calls' time while every backlog had tasks to run, ShareWant the
	// fair-share rule's; TakeoverSeconds how long after the first backlog ended it held every
	// slot it may (absent for that tenant, and when it never did).
	Share           float64  `json:"slot_share,omitempty"`
	ShareWant       float64  `json:"slot_share_want,omitempty"`
	TakeoverSeconds *float64 `json:"takeover_seconds,omitempty"`
}

type workloadJSON struct {
	Tasks          int                `json:"tasks"`
	Concurrency    int                `json:"concurrency"`
	Backlog        bool               `json:"backlog"` // every task submitted first: throughput is the drain's, concurrency the model-call slots
	LatencySeconds float64            `json:"latency_seconds"`
	Distribution   string             `json:"latency_dist"`
	InputBytes     int                `json:"input_bytes"`
	Failures       map[string]float64 `json:"failures"` // rate per failure kind
	Seed           uint64             `json:"seed"`
	// what was put through the emulators before the timed run (--warmup)
	WarmupTasks   int       `json:"warmup_tasks"`
	WarmupSeconds float64   `json:"warmup_seconds"`
	WarmupRounds  []float64 `json:"warmup_rounds"` // each round's throughput, tasks/s
}

type resultJSON struct {
	System             string  `json:"system"`
	Tasks              int     `json:"tasks"`
	Completed          int     `json:"completed"`
	Lost               int     `json:"lost"`
	WallSeconds        float64 `json:"wall_seconds"`
	Throughput         float64 `json:"throughput"` // completed tasks per second
	Bound              float64 `json:"bound"`      // Little's law, tasks per second
	Efficiency         float64 `json:"efficiency"` // throughput ÷ bound
	ModelMeanSeconds   float64 `json:"model_mean_seconds"`
	P50Seconds         float64 `json:"p50_seconds"`
	P99Seconds         float64 `json:"p99_seconds"`
	OverheadP50Seconds float64 `json:"overhead_p50_seconds"`
	OverheadP99Seconds float64 `json:"overhead_p99_seconds"`
	// closed loop: the overhead quantiles of the tasks submitted after the first webhook arrived
	WarmTasks              int     `json:"warm_tasks,omitempty"`
	WarmOverheadP50Seconds float64 `json:"warm_overhead_p50_seconds,omitempty"`
	WarmOverheadP99Seconds float64 `json:"warm_overhead_p99_seconds,omitempty"`
	RampSeconds            float64 `json:"ramp_seconds,omitempty"` // backlog: drain start to every slot busy
	TailSeconds            float64 `json:"tail_seconds,omitempty"` // backlog: last answer to last webhook
	// backlog: what a model call costs its caller beyond the model's latency, and the drain ÷
	// the bound at that call latency
	CallTransportSeconds float64        `json:"call_transport_seconds,omitempty"`
	CallEfficiency       float64        `json:"call_efficiency,omitempty"`
	FirestoreReads       int64          `json:"firestore_reads"`
	FirestoreWrites      int64          `json:"firestore_writes"`
	FirestoreCommits     int64          `json:"firestore_commits"`
	FirestoreByStep      []stepOpsJSON  `json:"firestore_by_step"` // per task
	OverheadByStep       []stepLatJSON  `json:"overhead_by_step"`
	Publishes            map[string]int `json:"publishes"` // per topic
	ModelCalls           int            `json:"model_calls"`
	Generations          int            `json:"generations"`
	BilledTokens         int64          `json:"billed_tokens"`
	NeededTokens         int64          `json:"needed_tokens"`
	BilledRatio          float64        `json:"billed_ratio"`
	Webhooks             int            `json:"webhooks"`
	Duplicates           int            `json:"duplicates"`
	Injected             map[string]int `json:"injected"` // failures injected, per kind
	PeakRSSBytes         int64          `json:"peak_rss_bytes"`
}

type stepOpsJSON struct {
	Step    string  `json:"step"`
	Reads   float64 `json:"reads_per_task"`
	Writes  float64 `json:"writes_per_task"`
	Commits float64 `json:"commits_per_task"`
}

type stepLatJSON struct {
	Step            string  `json:"step"`
	P50Seconds      float64 `json:"p50_seconds"`
	P99Seconds      float64 `json:"p99_seconds"`
	TailMeanSeconds float64 `json:"slowest_1pct_mean_seconds"`
}

// MarshalJSON writes the report for scripts: the workload and its failure mix, then each
// system's figures as the table has them, durations in seconds.
func (r Report) MarshalJSON() ([]byte, error) {
	c := r.Config
	out := reportJSON{
		Workload: workloadJSON{
			Tasks: c.Tasks, Concurrency: c.Concurrency, Backlog: c.Backlog, LatencySeconds: c.Latency.Seconds(),
			Distribution: c.Distribution, InputBytes: c.InputBytes, Seed: c.Seed,
			Failures:    map[string]float64{failModel: c.ModelErrors, failPublish: c.ResultLoss, failAck: c.AckLoss, failWebhook: c.WebhookErrors},
			WarmupTasks: r.Warmup.Tasks, WarmupSeconds: r.Warmup.Elapsed.Seconds(), WarmupRounds: r.Warmup.Rounds,
		},
		ElapsedSeconds: r.Elapsed.Seconds(),
	}
	results := []Result{r.Genbox}
	if r.Naive != nil {
		results = append(results, *r.Naive)
	}
	if r.Tenants != nil {
		results = []Result{r.Tenants.Run}
		for _, t := range r.Tenants.Tenants {
			tj := tenantJSON{Name: t.Name, Tasks: t.Tasks, Cap: t.Cap, AfterSeconds: t.After.Seconds(), Completed: t.Completed,
				Lost: t.Lost, Throughput: t.Throughput, Bound: t.Bound, Ratio: t.Ratio(), P50Seconds: t.P50.Seconds(),
				P99Seconds: t.P99.Seconds(), PeakCalls: t.PeakCalls, AloneP50Seconds: t.AloneP50.Seconds()}
			if t.Urgent > 0 {
				tj.UrgentStartSeconds = t.UrgentStart.Seconds()
			}
			tj.Weight = t.Weight
			if sh := r.Tenants.Shares; sh != nil {
				tj.Share, tj.ShareWant = sh.Of[t.Name], sh.Want[t.Name]
				if d, ok := sh.Takeover[t.Name]; ok {
					tj.TakeoverSeconds = new(d.Seconds())
				}
			}
			out.Tenants = append(out.Tenants, tj)
		}
	}
	for _, res := range results {
		out.Systems = append(out.Systems, res.json())
	}
	return json.Marshal(out)
}

func (r Result) json() resultJSON {
	s := func(d time.Duration) float64 { return d.Seconds() }
	ops := make([]stepOpsJSON, 0, len(r.Ops))
	for _, o := range r.Ops {
		ops = append(ops, stepOpsJSON{Step: o.Step, Reads: r.PerTask(o.Reads), Writes: r.PerTask(o.Writes), Commits: r.PerTask(o.Commits)})
	}
	steps := make([]stepLatJSON, 0, len(r.Steps))
	for _, l := range r.Steps {
		steps = append(steps, stepLatJSON{Step: l.Step, P50Seconds: s(l.P50), P99Seconds: s(l.P99), TailMeanSeconds: s(l.TailMean)})
	}
	return resultJSON{
		FirestoreByStep: ops, OverheadByStep: steps,
		System: r.System, Tasks: r.Tasks, Completed: r.Completed, Lost: r.Lost, WallSeconds: s(r.Wall),
		Throughput: r.Throughput, Bound: r.Bound, Efficiency: r.Efficiency(), ModelMeanSeconds: s(r.ModelMean),
		P50Seconds: s(r.P50), P99Seconds: s(r.P99), OverheadP50Seconds: s(r.OverheadP50), OverheadP99Seconds: s(r.OverheadP99),
		WarmTasks: r.WarmTasks, WarmOverheadP50Seconds: s(r.WarmOverheadP50), WarmOverheadP99Seconds: s(r.WarmOverheadP99),
		RampSeconds: s(r.Ramp), TailSeconds: s(r.Tail), CallTransportSeconds: s(r.CallTransport), CallEfficiency: r.CallEfficiency(),
		FirestoreReads: r.FirestoreReads, FirestoreWrites: r.FirestoreWrites, FirestoreCommits: r.FirestoreCommits,
		Publishes: r.Publishes, ModelCalls: r.ModelCalls, Generations: r.Generations, BilledTokens: r.BilledTokens,
		NeededTokens: r.NeededTokens, BilledRatio: r.BilledRatio(), Webhooks: r.Webhooks, Duplicates: r.Duplicates,
		Injected: r.Injected, PeakRSSBytes: r.PeakRSS,
	}
}
