package dlqnotifier

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

type fakePricer struct {
	EstimateFunc func(req gemini.Request) (int64, float64)
}

func (f fakePricer) Estimate(req gemini.Request) (int64, float64) { return f.EstimateFunc(req) }

type fakeRenderer struct {
	RenderFunc func(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error)
}

func (f fakeRenderer) Render(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error) {
	return f.RenderFunc(family, variant, input, cfg)
}

func TestEstimators(t *testing.T) {
	t.Parallel()
	var priced gemini.Request
	pricer := fakePricer{EstimateFunc: func(req gemini.Request) (int64, float64) { priced = req; return 1000, 0.25 }}
	render := fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		if input == "" {
			return nil, errors.New("erased")
		}
		return &prompts.Rendered{Prompt: "P:" + input, Models: []string{"family-default"}}, nil
	}}
	g := GeminiEstimator{Pricer: pricer, Prompts: render}
	tests := []struct {
		name   string
		est    Estimator
		task   store.Task
		want   float64
		ok     bool
		models []string
	}{
		{name: "recorded", est: RecordedEstimator{}, task: store.Task{ModelCalls: 4, CostUSD: 0.02}, want: 0.005, ok: true},
		{name: "recorded without calls", est: RecordedEstimator{}, task: store.Task{}, ok: false},
		{name: "gemini, family chain", est: g, task: store.Task{Input: "x"}, want: 0.25, ok: true, models: []string{"family-default"}},
		{name: "gemini, task chain", est: g, task: store.Task{Input: "x", ModelChain: []string{"a", "b"}}, want: 0.25, ok: true, models: []string{"a", "b"}},
		{name: "gemini, unrenderable", est: g, task: store.Task{ModelCalls: 2, CostUSD: 0.01}, want: 0.005, ok: true},
	}
	for _, tc := range tests {
		priced = gemini.Request{}
		got, ok := tc.est.EstimateUSD(&tc.task)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
		if tc.models != nil && (!slices.Equal(priced.Models, tc.models) || priced.Prompt != "P:x") {
			t.Errorf("%s: priced %+v", tc.name, priced)
		}
	}
}
