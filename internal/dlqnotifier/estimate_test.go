package dlqnotifier

import (
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/genbox-dev/genbox/internal/protocol"
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
		task   protocol.Task
		want   float64
		ok     bool
		models []string
	}{
		{name: "recorded", est: RecordedEstimator{}, task: protocol.Task{ModelCalls: 4, CostUSD: 0.02}, want: 0.005, ok: true},
		{name: "recorded without calls", est: RecordedEstimator{}, task: protocol.Task{}, ok: false},
		{name: "gemini, family chain", est: g, task: protocol.Task{Input: "x"}, want: 0.25, ok: true, models: []string{"family-default"}},
		{name: "gemini, task chain", est: g, task: protocol.Task{Input: "x", ModelChain: []string{"a", "b"}}, want: 0.25, ok: true, models: []string{"a", "b"}},
		{name: "gemini, unrenderable", est: g, task: protocol.Task{ModelCalls: 2, CostUSD: 0.01}, want: 0.005, ok: true},
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

// The deployed service prices Regenerate from the task's rendered prompt: a family that exists
// only in GENBOX_PROMPTS_DIR (its template, its model, its output bound), priced with
// GENBOX_PRICES, so a task with a much longer input is dearer although both tasks recorded the
// same spend. A task whose family no longer loads falls back to that recorded spend.
func TestRegenerateButtonPricesTheRenderedPrompt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dir := t.TempDir()
	family := "family: memo\nversion: '1'\nmodels: [m-dear]\nconfig: {max_output_tokens: 100}\ntemplate: 'Memo: {{.Input}}'\nvariants: {default: {}}\n"
	if err := os.WriteFile(filepath.Join(dir, "memo.yaml"), []byte(family), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{
		EnvProject: "p", EnvBotToken: "xoxb-test", EnvSigningSecret: testSecret, EnvChannel: testChannel,
		EnvApprovers: testApprover, EnvSlackAPIURL: e.cfg.SlackAPIURL, EnvPromptsDir: dir, EnvConsumer: ConsumerPull,
		"GENBOX_MODEL_CHAIN": "m-cheap", "GENBOX_PRICES": "m-cheap=0.1/0.4,m-dear=2/8",
	}
	cfg, err := FromEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	est, err := cfg.Estimator()
	if err != nil {
		t.Fatal(err)
	}
	svc := New(cfg, e.st, NewSlackClient(cfg), e.pub, est, slog.New(slog.DiscardHandler))
	// "Memo: " and the input make 400 or 400,000 bytes: 100 or 100,000 prompt tokens at $2/M,
	// plus 100 output tokens at $8/M on m-dear. Both tasks recorded 6 calls for $0.0006.
	for _, tc := range []struct{ id, family, input, label string }{
		{"t-short", "memo", strings.Repeat("s", 394), "Regenerate (~$0.0010)"},
		{"t-long", "memo", strings.Repeat("l", 399994), "Regenerate (~$0.2008)"},
		{"t-retired", "retired", "x", "Regenerate (~$0.0001)"},
	} {
		tk := e.deadTask(t, tc.id, func(tk *protocol.Task) { tk.Family, tk.Input = tc.family, tc.input })
		svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
		dl := protocol.DeadLetterID(tc.id, task.StageGeneration, 0, 0)
		var label string
		for _, p := range e.slack.Posts() {
			for _, b := range buttons(t, p) {
				if b[0] == string(ActionRegenerate) && b[2] == dl {
					label = b[1]
				}
			}
		}
		if label != tc.label {
			t.Errorf("%s: Regenerate button %q, want %q", tc.id, label, tc.label)
		}
	}
}
