package dlqnotifier

import (
	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Pricer prices the worst case of one call before it is made (gemini.Pricing).
type Pricer interface {
	Estimate(req gemini.Request) (tokens int64, costUSD float64)
}

// Renderer renders a task's prompt from its family and variant (prompts.Registry).
type Renderer interface {
	Render(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error)
}

var (
	_ Pricer    = gemini.Pricing{}
	_ Renderer  = (*prompts.Registry)(nil)
	_ Estimator = GeminiEstimator{}
)

// GeminiEstimator prices a regeneration as the worker's max_cost_usd check does: the task's
// rendered prompt and largest output at the most expensive model of its chain. Where the prompt
// cannot be rendered (an erased input, a retired variant) it falls back to RecordedEstimator.
type GeminiEstimator struct {
	Pricer  Pricer
	Prompts Renderer
}

// EstimateUSD implements Estimator.
func (g GeminiEstimator) EstimateUSD(t *protocol.Task) (float64, bool) {
	r, err := g.Prompts.Render(t.Family, t.Variant, t.Input, t.GenConfig)
	if err != nil {
		return RecordedEstimator{}.EstimateUSD(t)
	}
	_, usd := g.Pricer.Estimate(t.Request(r))
	return usd, true
}

// EstimateUSD prices one more generation of t as the Regenerate button does (the console's
// estimate is the same).
func (s *Service) EstimateUSD(t *protocol.Task) (float64, bool) { return s.est.EstimateUSD(t) }
