package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/leader"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// DrillModels makes the drill's calls and tells each family's chain (gemini.Client).
type DrillModels interface {
	Generator
	Chain(req gemini.Request) []string
}

// Catalog lists the prompt families and renders them (prompts.Registry).
type Catalog interface {
	Renderer
	Families() []string
}

var (
	_ DrillModels = (*gemini.Client)(nil)
	_ Catalog     = (*prompts.Registry)(nil)
)

// DrillDoc is the leaders/{id} document through which one instance claims each drill.
const DrillDoc = "fallback-drill"

// drillInput is the small task every family is drilled with.
const drillInput = "Fallback drill: the quarterly report says revenue rose 3% while costs held flat."

// drillTenant is the tenant the drill's calls are metered under.
const drillTenant = "genbox-fallback-drill"

// Drill automates the fallback drill: every Every, one instance — whichever claims the run first
// in leaders/fallback-drill — sends one small request per prompt family through each fallback
// model of the family's chain, each model alone as an outage of the models before it would, and
// reports what each answered (latency, cost, whether the output passed the family's validator)
// to the alerts channel and as metrics, so that a broken fallback is found before an outage needs
// it. The drill's calls go through the model client's policy (limits, breakers, retries).
type Drill struct {
	Store   *store.Store
	Models  DrillModels
	Catalog Catalog
	Pub     Publisher
	Log     *slog.Logger
	Metrics *obs.Metrics // nil records nothing
	Every   time.Duration
}

// DrillResult is one fallback model's answer to one family's drill request.
type DrillResult struct {
	Family, Model string
	Outcome       string // "ok", "invalid" (the validator refused it), "unavailable" (its breaker is open), or the failure's class
	Latency       time.Duration
	CostUSD       float64
	Err           error
}

// Run drills every Every until ctx ends; it looks for a due drill every minute at most. Every
// instance looks: the drill's own claim (claim) picks the one that drills.
func (d *Drill) Run(ctx context.Context) {
	loop := &leader.Loop{Name: "fallback drill", Interval: min(d.Every, time.Minute), Log: d.Log}
	loop.Run(ctx, func(ctx context.Context, _ int64) time.Time {
		if due, err := d.claim(ctx); err != nil && ctx.Err() == nil {
			d.Log.WarnContext(ctx, "fallback drill: claim", "error", err)
		} else if due {
			d.Report(ctx, d.Drill(ctx))
		}
		return time.Time{}
	})
}

// claim takes the next drill if it is due: next_at in leaders/fallback-drill has passed (or was
// never set), and moving it Every ahead is not beaten by another instance.
func (d *Drill) claim(ctx context.Context) (bool, error) {
	return d.Store.TakeTurn(ctx, DrillDoc, d.Every)
}

// Drill sends each family's drill request through each of its fallback models and returns what
// each answered. A family whose chain has no fallback is not drilled.
func (d *Drill) Drill(ctx context.Context) []DrillResult {
	var out []DrillResult
	for _, family := range d.Catalog.Families() {
		r, err := d.Catalog.Render(family, "", drillInput, nil)
		if err != nil {
			d.Log.ErrorContext(ctx, "fallback drill: render", "family", family, "error", err)
			continue
		}
		req := gemini.NewRequest("fallback-drill-"+family, drillTenant, r)
		chain := d.Models.Chain(req)
		for _, model := range chain[1:] {
			one := req
			one.Models = []string{model}
			start := time.Now()
			res, err := d.Models.Generate(ctx, one)
			dr := DrillResult{Family: family, Model: model, Latency: time.Since(start), CostUSD: res.CostUSD, Err: err, Outcome: "ok"}
			switch {
			case err == nil:
			case errors.Is(err, gemini.ErrUnavailable):
				dr.Outcome = "unavailable"
			case gemini.ClassOf(err) == gemini.Quality:
				dr.Outcome = "invalid"
			default:
				dr.Outcome = string(gemini.ClassOf(err))
			}
			if protocol.Spent(res) {
				d.Metrics.Generation(ctx, model, drillTenant, res.Usage, res.CostUSD, dr.Latency)
			}
			d.Metrics.FallbackDrill(ctx, family, model, dr.Outcome, dr.Latency)
			out = append(out, dr)
		}
	}
	return out
}

// Report logs the drill's results and posts them as one alert (genbox-alerts, keyed by the
// drill's time so that no cooldown swallows it).
func (d *Drill) Report(ctx context.Context, results []DrillResult) {
	ok := 0
	var b strings.Builder
	for _, r := range results {
		if r.Outcome == "ok" {
			ok++
		}
		fmt.Fprintf(&b, "\n• %s on %s: %s in %s, $%.6f", r.Family, r.Model, r.Outcome, r.Latency.Round(time.Millisecond), r.CostUSD)
		if r.Err != nil {
			fmt.Fprintf(&b, " (%v)", r.Err)
		}
		log := d.Log.With("family", r.Family, "model", r.Model, "outcome", r.Outcome, "latency_ms", r.Latency.Milliseconds(), "cost_usd", r.CostUSD)
		if r.Outcome == "ok" {
			log.InfoContext(ctx, "fallback drill")
		} else {
			log.WarnContext(ctx, "fallback drill: a fallback model did not answer", "error", r.Err)
		}
	}
	msg := fmt.Sprintf("fallback drill: %d of %d fallback calls answered with a valid output", ok, len(results)) + b.String()
	key := "fallback-drill:" + d.Store.Now().UTC().Format(time.RFC3339)
	if _, err := d.Pub.Publish(ctx, bus.TopicAlerts, []byte(msg), map[string]string{task.AttrKind: task.AttrKindAlert, task.AttrAlert: key}); err != nil {
		d.Log.WarnContext(ctx, "fallback drill: report not published", "error", err)
	}
}
