package obs_test

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// run is one full run of the stack: its telemetry, every service's log, the tasks it carried
// and the secrets it held.
type run struct {
	stack   *devstack.Stack
	tel     *obstest.Telemetry
	logs    *obstest.Buffer
	secret  string // the dev tenant's webhook secret
	inputs  []string
	tasks   []*task.View
	webhook map[string]doubles.Hook // by task id
}

// tasksPerRun is how many tasks one run submits.
const tasksPerRun = 3

// fullRun starts the stack with in-memory telemetry and services logging in Cloud Logging JSON
// with the default options, submits tasksPerRun tasks over REST and waits for each one's verified
// webhook. The sweeper is held off (long nudge grace) so every nudge is the services' own.
func fullRun(t *testing.T) *run {
	t.Helper()
	r := start(t, "GENBOX_NUDGE_GRACE", "30s")
	s := r.stack
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range tasksPerRun {
		in := "INPUT-" + s.Info.Project + "-" + string(rune('a'+i)) + ": the quarterly report says revenue rose."
		v := s.SubmitWait(t, ctx, task.Request{Family: "summarize", Input: in})
		r.inputs = append(r.inputs, in)
		if v.State != task.StateSucceeded || v.Output == nil {
			t.Fatalf("task %s ended %s", v.TaskID, v.State)
		}
		r.tasks = append(r.tasks, v)
		d, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.Event().Data.TaskID == v.TaskID })
		if err != nil {
			t.Fatal(err)
		}
		r.webhook[v.TaskID] = d
	}
	// The webhook POST span ends after the listener answered, and the delivery is recorded after
	// that: wait until every task's delivery is recorded, so every span has ended.
	for _, v := range r.tasks {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			got, err := s.Store.GetTask(ctx, v.TaskID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Delivery.State == task.DeliveryDelivered && len(spansNamed(r.tel.TaskSpans(v.TaskID), "webhook POST")) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task %s delivery %s", v.TaskID, got.Delivery.State)
			}
		}
	}
	return r
}

// start starts the stack with in-memory telemetry, every service logging Cloud Logging JSON
// with the default options into one buffer, and ShortEnv(extra...).
func start(t *testing.T, extra ...string) *run {
	t.Helper()
	tel := obstest.Install(t)
	logs := &obstest.Buffer{}
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	oc, err := obs.ConfigFromEnv(func(string) string { return "" }, "devstack") // the defaults
	if err != nil {
		t.Fatal(err)
	}
	s := devstack.StartTestWith(t, func(cfg *devstack.Config) {
		cfg.WebhookSecret = secret
		cfg.Log = oc.Logger(logs)
		cfg.Out = io.Discard // the tenant's listener prints deliveries, content included: not a service log
		cfg.Metrics = tel.Metrics
	}, extra...)
	return &run{stack: s, tel: tel, logs: logs, secret: secret, webhook: map[string]doubles.Hook{}}
}

func spansNamed(spans []sdktrace.ReadOnlySpan, prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

// Not parallel (global telemetry); one stack serves the three checks.
//
//nolint:paralleltest // it installs global telemetry; its subtests check one run
func TestOneTaskRun(t *testing.T) {
	r := fullRun(t)
	t.Run("one trace per task", r.checkTraces)
	t.Run("metrics match the ledger", r.checkMetrics)
	t.Run("logs hold no content or secrets", r.checkLogs)
}

// Every span of a task is in one trace, rooted at the publisher's HTTP span, and the trace
// covers publisher (HTTP, publish) → worker (process, claim, Gemini call, publish) →
// resulthandler (process, webhook POST), each span the child of one in the same trace.
func (r *run) checkTraces(t *testing.T) {
	for _, v := range r.tasks {
		tagged := r.tel.TaskSpans(v.TaskID)
		if len(tagged) == 0 {
			t.Fatalf("task %s: no spans", v.TaskID)
		}
		id := tagged[0].SpanContext().TraceID()
		for _, s := range tagged {
			if s.SpanContext().TraceID() != id {
				t.Errorf("task %s: span %q is in trace %s, not %s", v.TaskID, s.Name(), s.SpanContext().TraceID(), id)
			}
		}
		spans := r.tel.Trace(id)
		byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
		for _, s := range spans {
			byID[s.SpanContext().SpanID()] = s
		}
		var roots []string
		for _, s := range spans {
			if _, ok := byID[s.Parent().SpanID()]; !ok {
				roots = append(roots, s.Name())
			}
		}
		if len(roots) != 1 || !strings.HasPrefix(roots[0], "publisher POST") {
			t.Errorf("task %s: trace roots %v, want the publisher's POST span alone", v.TaskID, roots)
		}
		for _, want := range []string{"publisher POST", "publish " + "gemini-tasks", "process gemini-tasks-worker",
			"claim task", "gemini generate", "publish gemini-results", "process gemini-results-resulthandler", "webhook POST"} {
			if len(spansNamed(spans, want)) == 0 {
				t.Errorf("task %s: no %q span in its trace %v", v.TaskID, want, obstest.Names(spans))
			}
		}
		// The causal links: each span descends from the one that caused it.
		for _, link := range [][2]string{
			{"publish gemini-tasks", "publisher POST"},
			{"process gemini-tasks-worker", "publish gemini-tasks"},
			{"claim task", "process gemini-tasks-worker"},
			{"gemini generate", "process gemini-tasks-worker"},
			{"publish gemini-results", "process gemini-tasks-worker"},
			{"process gemini-results-resulthandler", "publish gemini-results"},
			{"webhook POST", "process gemini-results-resulthandler"},
		} {
			child, parent := spansNamed(spans, link[0]), spansNamed(spans, link[1])
			if len(child) == 0 || len(parent) == 0 {
				continue
			}
			if !descends(byID, child[0], parent[0]) {
				t.Errorf("task %s: %q does not descend from %q", v.TaskID, link[0], link[1])
			}
		}
		gen, res := spansNamed(spans, "gemini generate"), spansNamed(spans, "publish gemini-results")
		if len(gen) > 0 && len(res) > 0 && res[0].StartTime().Before(gen[len(gen)-1].EndTime()) {
			t.Errorf("task %s: the result was published before the Gemini call ended", v.TaskID)
		}
		for _, s := range spansNamed(spans, "gemini generate") {
			model, _ := obstest.Attr(s, obs.SpanModel)
			out, _ := obstest.Attr(s, obs.SpanOutputTokens)
			if model.AsString() == "" || out.AsInt64() <= 0 || s.Status().Code == codes.Error {
				t.Errorf("task %s: Gemini span model %q output tokens %d status %v", v.TaskID, model.AsString(), out.AsInt64(), s.Status())
			}
		}
	}
}

// descends reports whether s has ancestor a within the trace.
func descends(byID map[trace.SpanID]sdktrace.ReadOnlySpan, s, a sdktrace.ReadOnlySpan) bool {
	for p, ok := byID[s.Parent().SpanID()]; ok; p, ok = byID[p.Parent().SpanID()] {
		if p.SpanContext().SpanID() == a.SpanContext().SpanID() {
			return true
		}
	}
	return false
}

// Task counts by state and family, and tokens and cost by model and tenant, equal what the run
// did and what the fake Gemini billed.
func (r *run) checkMetrics(t *testing.T) {
	n := float64(len(r.tasks))
	for _, state := range []string{"queued", "running", "succeeded"} {
		if got := r.tel.Sum(t, obs.MetricTasks, "state="+state, "family=summarize"); got != n {
			t.Errorf("%s{state=%s,family=summarize} = %g, want %g", obs.MetricTasks, state, got, n)
		}
	}
	if got := r.tel.Sum(t, obs.MetricTaskE2ELatency, "state=succeeded"); got != n {
		t.Errorf("%s{state=succeeded} count %g, want %g", obs.MetricTaskE2ELatency, got, n)
	}
	ledger := r.stack.Fake.Ledger()
	if ledger.Total.Generations != len(r.tasks) {
		t.Errorf("the fake billed %d generations for %d tasks", ledger.Total.Generations, len(r.tasks))
	}
	for model, tally := range ledger.PerModel {
		if tally.Generations == 0 {
			continue
		}
		price := gemini.DefaultPrices[model]
		if price.InputPerM == 0 {
			t.Fatalf("model %s has no default price: the cost check would be vacuous", model)
		}
		m, tn := "model="+model, "tenant="+devstack.DevTenant
		if got := r.tel.Sum(t, obs.MetricTokens, m, tn, "kind=prompt"); got != float64(tally.Billed.PromptTokens) {
			t.Errorf("%s{%s,kind=prompt} = %g, the ledger billed %d", obs.MetricTokens, m, got, tally.Billed.PromptTokens)
		}
		if got := r.tel.Sum(t, obs.MetricTokens, m, tn, "kind=output"); got != float64(tally.Billed.OutputTokens) {
			t.Errorf("%s{%s,kind=output} = %g, the ledger billed %d", obs.MetricTokens, m, got, tally.Billed.OutputTokens)
		}
		want := price.Cost(tally.Billed.PromptTokens, tally.Billed.OutputTokens)
		if got := r.tel.Sum(t, obs.MetricCost, m, tn); want == 0 || math.Abs(got-want) > 1e-12 {
			t.Errorf("%s{%s} = %g, the ledger's tokens cost %g", obs.MetricCost, m, got, want)
		}
		if got := r.tel.Sum(t, obs.MetricGenLatency, m); got != float64(tally.Generations) {
			t.Errorf("%s{%s} count %g, want %d generations", obs.MetricGenLatency, m, got, tally.Generations)
		}
	}
	if got := r.tel.Sum(t, obs.MetricWebhookAttempts, "outcome=delivered"); got != n {
		t.Errorf("%s{outcome=delivered} = %g, want %g", obs.MetricWebhookAttempts, got, n)
	}
}

// Every line of every service is Cloud Logging JSON; the lines of a task carry its task_id and
// trace; no line holds an input, an output, the API key, the admin key, the webhook secret or the
// Slack signing secret.
func (r *run) checkLogs(t *testing.T) {
	forbidden := map[string]string{
		"API key": r.stack.Info.APIKey, "admin key": r.stack.Info.AdminKey, "webhook secret": r.secret,
		"webhook secret body": strings.TrimPrefix(r.secret, "whsec_"),
	}
	for i, in := range r.inputs {
		forbidden["input "+string(rune('a'+i))] = in
	}
	for _, v := range r.tasks {
		forbidden["output of "+v.TaskID] = *v.Output
		forbidden["webhook body of "+v.TaskID] = r.webhook[v.TaskID].Body
	}
	lines := r.logs.Lines()
	if len(lines) == 0 {
		t.Fatal("no service logged anything")
	}
	services := map[string]bool{}
	withTask := map[string]int{}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("not JSON: %s", l)
			continue
		}
		if m[obs.KeySeverity] == nil || m[obs.KeyMessage] == nil {
			t.Errorf("line without severity or message: %s", l)
		}
		svc, _ := m["service"].(string)
		services[svc] = true
		if id, _ := m[obs.KeyTaskID].(string); id != "" {
			withTask[id]++
		}
		for what, s := range forbidden {
			if s != "" && strings.Contains(l, s) {
				t.Errorf("a %s line holds the %s: %s", svc, what, l)
			}
		}
	}
	for _, v := range r.tasks {
		if withTask[v.TaskID] == 0 {
			t.Errorf("no line carries task_id %s", v.TaskID)
		}
	}
	for _, svc := range []string{"worker", "resulthandler"} {
		if !services[svc] {
			t.Errorf("no %s line captured (services seen: %v)", svc, services)
		}
	}
}
