package rerun_test

import (
	"errors"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMatches(t *testing.T) {
	t.Parallel()
	tk := &protocol.Task{State: task.StateSucceeded, Family: "summarize", Variant: "", PromptVersion: "v1",
		Labels: map[string]string{"app": "news", "env": "prod"}}
	for _, tc := range []struct {
		name string
		f    task.RerunFilter
		want bool
	}{
		{"empty", task.RerunFilter{}, true},
		{"state", task.RerunFilter{State: task.StateSucceeded}, true},
		{"another state", task.RerunFilter{State: task.StateFailed}, false},
		{"family", task.RerunFilter{Family: "summarize"}, true},
		{"another family", task.RerunFilter{Family: "classify"}, false},
		{"the default variant by name", task.RerunFilter{Variant: prompts.DefaultVariant}, true},
		{"another variant", task.RerunFilter{Variant: "digest"}, false},
		{"prompt version", task.RerunFilter{PromptVersion: "v1"}, true},
		{"another prompt version", task.RerunFilter{PromptVersion: "v2"}, false},
		{"labels it carries", task.RerunFilter{Labels: map[string]string{"app": "news", "env": "prod"}}, true},
		{"a label value it lacks", task.RerunFilter{Labels: map[string]string{"app": "blog"}}, false},
		{"a label key it lacks", task.RerunFilter{Labels: map[string]string{"team": "a"}}, false},
	} {
		if got := rerun.Matches(tc.f, tk); got != tc.want {
			t.Errorf("%s: Matches = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	labels := map[string]string{}
	for i := range rerun.MaxLabels + 1 {
		labels[string(rune('a'+i))] = "x"
	}
	for _, tc := range []struct {
		f     task.RerunFilter
		field string
	}{
		{task.RerunFilter{}, ""},
		{task.RerunFilter{State: task.StateDead}, ""},
		{task.RerunFilter{State: task.StateQueued}, "filter.state"},
		{task.RerunFilter{State: task.StateCancelled}, "filter.state"},
		{task.RerunFilter{CreatedAfter: &now, CreatedBefore: new(now.Add(time.Hour))}, ""},
		{task.RerunFilter{CreatedAfter: &now, CreatedBefore: &now}, "filter.created_after"},
		{task.RerunFilter{Labels: labels}, "filter.labels"},
	} {
		err := rerun.Validate(tc.f)
		var fe *rerun.FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.f, err)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
			t.Errorf("%+v: %v, want a refusal of %s", tc.f, err, tc.field)
		}
	}
}

func TestBlocked(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name    string
		tk      protocol.Task
		blocked bool
	}{
		{"succeeded", protocol.Task{State: task.StateSucceeded}, false},
		{"dead", protocol.Task{State: task.StateDead}, false},
		{"running", protocol.Task{State: task.StateRunning}, true},
		{"cancelled", protocol.Task{State: task.StateCancelled}, true},
		{"erased", protocol.Task{State: task.StateSucceeded, ErasedAt: &now}, true},
		{"an open dead letter", protocol.Task{State: task.StateDead, OpenDeadLetters: []string{"x"}}, true},
	} {
		if got := rerun.Blocked(&tc.tk) != ""; got != tc.blocked {
			t.Errorf("%s: blocked %v, want %v", tc.name, got, tc.blocked)
		}
	}
}

// A task a model answered is priced from its recorded tokens at the rates of the model and the
// tier that served it; one no model answered at the worst case of its prompt, as Regenerate.
func TestEstimatorCost(t *testing.T) {
	t.Parallel()
	reg, err := prompts.Default()
	if err != nil {
		t.Fatal(err)
	}
	p := gemini.DefaultPricing()
	e := rerun.Estimator{Pricing: p, Prompts: reg}
	usage := task.Usage{PromptTokens: 1000, OutputTokens: 200, CachedTokens: 400}
	flash := p.Price("gemini-2.5-flash")
	answered := &protocol.Task{Family: "summarize", Input: "x", Model: "gemini-2.5-flash", Usage: usage}
	r, err := reg.Render("summarize", "", "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, worst := p.Estimate((&protocol.Task{Family: "summarize", Input: "x"}).Request(r))
	for _, tc := range []struct {
		name string
		tk   *protocol.Task
		want float64
	}{
		{"standard", answered, flash.Bill(usage, gemini.TierStandard)},
		{"flex", &protocol.Task{Model: "gemini-2.5-flash", Usage: usage, Mode: task.ModeFlex}, flash.Bill(usage, gemini.TierFlex)},
		{"batch", &protocol.Task{Model: "gemini-2.5-flash", Usage: usage, Mode: task.ModeBatch}, flash.Bill(usage, gemini.TierBatch)},
		{"a fallback model", &protocol.Task{Model: "gemini-2.5-flash-lite", Usage: usage}, p.Price("gemini-2.5-flash-lite").Bill(usage, gemini.TierStandard)},
		{"no model answered", &protocol.Task{Family: "summarize", Input: "x"}, worst},
	} {
		if got := e.Cost(tc.tk, r); got != tc.want || got <= 0 {
			t.Errorf("%s: $%g, want $%g", tc.name, got, tc.want)
		}
	}
}
