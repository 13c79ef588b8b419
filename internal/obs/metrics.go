package obs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/genbox-dev/genbox/pkg/task"
)

// InstrumentationName names genbox's tracer and meter.
const InstrumentationName = "github.com/genbox-dev/genbox"

// Tracer returns genbox's tracer from the global provider that Setup installed.
func Tracer() trace.Tracer { return otel.Tracer(InstrumentationName) }

// Metric names: stable, as dashboards and alerts refer to them.
const (
	MetricTasks           = "genbox.tasks"
	MetricTaskE2ELatency  = "genbox.task.e2e_latency"
	MetricGenLatency      = "genbox.generation.latency"
	MetricTokens          = "genbox.tokens"
	MetricCost            = "genbox.cost_usd"
	MetricCacheHits       = "genbox.cache.hits"
	MetricRetries         = "genbox.retries"
	MetricBreakerState    = "genbox.breaker.state"
	MetricDeadLettersOpen = "genbox.dead_letters.open"
	MetricPendingAge      = "genbox.pending.oldest_age"
	MetricWebhookAttempts = "genbox.webhook.attempts"
	MetricWebhookLatency  = "genbox.webhook.latency"
	MetricDrillCalls      = "genbox.fallback_drill.calls"
	MetricDrillLatency    = "genbox.fallback_drill.latency"
	MetricTenantSlots     = "genbox.tenant.slots"
)

// Metric attribute keys.
const (
	AttrState   = "state"
	AttrFamily  = "family"
	AttrModel   = "model"
	AttrTenant  = "tenant"
	AttrKind    = "kind" // tokens: prompt, output or cached
	AttrClass   = "class"
	AttrStage   = "stage"
	AttrOutcome = "outcome"
	AttrEvent   = "event"
)

// Token kinds of genbox.tokens.
const (
	TokensPrompt = "prompt"
	TokensOutput = "output"
	// TokensCached counts the prompt tokens a context cache served (a part of prompt's).
	TokensCached = "cached"
)

// Breaker gauge values of genbox.breaker.state, by the breaker state names of pkg/gemini.
var breakerValues = map[string]int64{"closed": 0, "half_open": 1, "open": 2}

// Metrics holds every genbox instrument. Its methods are safe for concurrent use, and a nil
// *Metrics does nothing, so services call them unconditionally.
type Metrics struct {
	tasks           metric.Int64Counter
	taskE2E         metric.Float64Histogram
	genLatency      metric.Float64Histogram
	tokens          metric.Int64Counter
	cost            metric.Float64Counter
	cacheHits       metric.Int64Counter
	retries         metric.Int64Counter
	breaker         metric.Int64Gauge
	deadLetters     metric.Int64Gauge
	pendingAge      metric.Float64ObservableGauge
	webhookAttempts metric.Int64Counter
	webhookLatency  metric.Float64Histogram
	drillCalls      metric.Int64Counter
	drillLatency    metric.Float64Histogram
	genAI           genAIInstruments
	tenantSlots     metric.Int64Counter
	meter           metric.Meter

	batchOnce sync.Once
	batchInst *batchInstruments
	batchErr  error

	workerOnce sync.Once
	workerInst *workerInstruments
	workerErr  error

	shareOnce sync.Once
	shareInst *shareInstruments
	shareErr  error
}

// NewMetrics creates every instrument on mp (otel.GetMeterProvider() after Setup; a
// ManualReader's provider in tests).
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	mt := mp.Meter(InstrumentationName)
	m := &Metrics{meter: mt}
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// The counters and the latency histograms differ only in what they say.
	count := func(name, unit, desc string) metric.Int64Counter {
		c, err := mt.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return c
	}
	seconds := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		h, err := mt.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		check(err)
		return h
	}
	var err error
	m.tasks = count(MetricTasks, "{task}", "Tasks entering a state, by state and family.")
	m.taskE2E = seconds(MetricTaskE2ELatency, "Time from submission to an end state, by family and state.",
		0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600)
	m.genLatency = seconds(MetricGenLatency, "Duration of one task's generation (every attempt and fallback), by model.",
		0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
	m.tokens = count(MetricTokens, "{token}", "Tokens billed, by model, tenant and kind (prompt or output).")
	m.cost, err = mt.Float64Counter(MetricCost, metric.WithUnit("USD"),
		metric.WithDescription("Estimated cost of model calls, by model and tenant."))
	check(err)
	m.cacheHits = count(MetricCacheHits, "{hit}", "Generations served without a model call, by family.")
	m.retries = count(MetricRetries, "{retry}", "Retries, by error class.")
	m.tenantSlots = count(MetricTenantSlots, "{task}",
		"Tenants' concurrency slots, by tenant and event: taken (a claim below the cap), waiting (a task marked waiting at the cap), handed_off (a slot passed to a waiting task), freed (given back, none waiting).")
	m.breaker, err = mt.Int64Gauge(MetricBreakerState,
		metric.WithDescription("Circuit breaker state by model: 0 closed, 1 half-open, 2 open."))
	check(err)
	m.deadLetters, err = mt.Int64Gauge(MetricDeadLettersOpen, metric.WithUnit("{task}"),
		metric.WithDescription("Dead letters awaiting a human decision, by stage."))
	check(err)
	m.pendingAge, err = mt.Float64ObservableGauge(MetricPendingAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending work: now - pending_since."))
	check(err)
	m.webhookAttempts = count(MetricWebhookAttempts, "{attempt}", "Webhook delivery attempts, by outcome.")
	m.webhookLatency = seconds(MetricWebhookLatency, "Duration of one webhook POST, by outcome.",
		0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
	m.drillCalls = count(MetricDrillCalls, "{call}",
		"Calls of the fallback drill, by family, model and outcome (ok, invalid, unavailable or the failure's class).")
	m.drillLatency = seconds(MetricDrillLatency, "Duration of one fallback drill call, by model and outcome.",
		0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
	m.genAI, err = newGenAIInstruments(mt)
	check(err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create instruments: %w", err)
	}
	return m, nil
}

// TaskState counts a task entering state (queued on submit, running on claim, ...).
func (m *Metrics) TaskState(ctx context.Context, family string, state task.State) {
	if m == nil {
		return
	}
	m.tasks.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrState, string(state)), attribute.String(AttrFamily, family)))
}

// TaskFinished counts a task entering the end state state and records its end-to-end latency
// (now - created_at) when e2e > 0.
func (m *Metrics) TaskFinished(ctx context.Context, family string, state task.State, e2e time.Duration) {
	if m == nil {
		return
	}
	attrs := metric.WithAttributes(attribute.String(AttrState, string(state)), attribute.String(AttrFamily, family))
	m.tasks.Add(ctx, 1, attrs)
	if e2e > 0 {
		m.taskE2E.Record(ctx, e2e.Seconds(), attrs)
	}
}

// Generation records one task's generation on model for tenant: the tokens billed (prompt and
// output), their cost and the generation's duration. Call it for failed generations too: their
// tokens were paid.
func (m *Metrics) Generation(ctx context.Context, model, tenant string, usage task.Usage, costUSD float64, dur time.Duration) {
	if m == nil {
		return
	}
	mt, tn := attribute.String(AttrModel, model), attribute.String(AttrTenant, tenant)
	if usage.PromptTokens > 0 {
		m.tokens.Add(ctx, usage.PromptTokens, metric.WithAttributes(mt, tn, attribute.String(AttrKind, TokensPrompt)))
	}
	if usage.OutputTokens > 0 {
		m.tokens.Add(ctx, usage.OutputTokens, metric.WithAttributes(mt, tn, attribute.String(AttrKind, TokensOutput)))
	}
	if usage.CachedTokens > 0 {
		m.tokens.Add(ctx, usage.CachedTokens, metric.WithAttributes(mt, tn, attribute.String(AttrKind, TokensCached)))
	}
	if costUSD > 0 {
		m.cost.Add(ctx, costUSD, metric.WithAttributes(mt, tn))
	}
	if dur > 0 {
		m.genLatency.Record(ctx, dur.Seconds(), metric.WithAttributes(mt))
	}
}

// CacheHit counts a generation of family served without a model call.
func (m *Metrics) CacheHit(ctx context.Context, family string) {
	if m == nil {
		return
	}
	m.cacheHits.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrFamily, family)))
}

// Retry counts one retry of a failure of class (gemini.Class values, or "delivery" and the like).
func (m *Metrics) Retry(ctx context.Context, class string) {
	if m == nil {
		return
	}
	m.retries.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrClass, class)))
}

// Slot events of genbox.tenant.slots. A tenant's tasks running are taken − freed; its tasks
// waiting, waiting − handed_off − those taken after waiting.
const (
	SlotTaken     = "taken"
	SlotWaiting   = "waiting"
	SlotHandedOff = "handed_off"
	SlotFreed     = "freed"
)

// TenantSlot records one of tenant's slot events (SlotTaken, ...).
func (m *Metrics) TenantSlot(ctx context.Context, tenant, event string) {
	if m == nil {
		return
	}
	m.tenantSlots.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrTenant, tenant), attribute.String(AttrEvent, event)))
}

// Breaker records model's breaker state: "closed", "half_open" or "open" (gemini.BreakerState).
// Unknown states are ignored.
func (m *Metrics) Breaker(ctx context.Context, model, state string) {
	if m == nil {
		return
	}
	if v, ok := breakerValues[state]; ok {
		m.breaker.Record(ctx, v, metric.WithAttributes(attribute.String(AttrModel, model)))
	}
}

// DeadLettersOpen records how many dead letters of stage (task.Stage) await a human decision,
// as counted from Firestore (so the gauge survives restarts).
func (m *Metrics) DeadLettersOpen(ctx context.Context, stage task.Stage, n int64) {
	if m == nil {
		return
	}
	m.deadLetters.Record(ctx, n, metric.WithAttributes(attribute.String(AttrStage, string(stage))))
}

// ObservePendingAge feeds genbox.pending.oldest_age from oldest, called at each collection:
// it returns the age of the oldest pending work, or ok false when nothing is pending (then nothing
// is reported). The sweeper provides it and calls unregister when it stops.
func (m *Metrics) ObservePendingAge(oldest func(ctx context.Context) (age time.Duration, ok bool)) (unregister func() error, err error) {
	if m == nil {
		return func() error { return nil }, nil
	}
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if age, ok := oldest(ctx); ok {
			o.ObserveFloat64(m.pendingAge, age.Seconds())
		}
		return nil
	}, m.pendingAge)
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", MetricPendingAge, err)
	}
	return reg.Unregister, nil
}

// WebhookAttempt records one webhook POST: its outcome ("delivered", "failed", "timeout", ...)
// and duration.
func (m *Metrics) WebhookAttempt(ctx context.Context, outcome string, dur time.Duration) {
	if m == nil {
		return
	}
	attrs := metric.WithAttributes(attribute.String(AttrOutcome, outcome))
	m.webhookAttempts.Add(ctx, 1, attrs)
	m.webhookLatency.Record(ctx, dur.Seconds(), attrs)
}

// FallbackDrill records one call of the fallback drill: family's request sent to model alone,
// its outcome ("ok", "invalid", "unavailable" or the failure's class) and duration.
func (m *Metrics) FallbackDrill(ctx context.Context, family, model, outcome string, dur time.Duration) {
	if m == nil {
		return
	}
	m.drillCalls.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrFamily, family), attribute.String(AttrModel, model), attribute.String(AttrOutcome, outcome)))
	m.drillLatency.Record(ctx, dur.Seconds(), metric.WithAttributes(attribute.String(AttrModel, model), attribute.String(AttrOutcome, outcome)))
}
