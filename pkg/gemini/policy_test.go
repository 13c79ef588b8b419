package gemini_test

import (
	"context"
	"sync"
	"testing"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// render builds a request the way the worker does: from a prompt family.
func render(t testing.TB, family, variant, input string, over *task.GenConfig) (gemini.Request, *prompts.Rendered) {
	t.Helper()
	reg, err := prompts.Default()
	if err != nil {
		t.Fatal(err)
	}
	r, err := reg.Render(family, variant, input, over)
	if err != nil {
		t.Fatal(err)
	}
	return gemini.NewRequest("q", "t1", r), r
}

func TestQualityRetryLowersTemperature(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var temps []float64
	b := setup(t, nil, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		mu.Lock()
		temps = append(temps, *r.Temperature)
		mu.Unlock()
		if r.Call == 0 {
			return geminitest.Reply{Text: `{"category": "billing", "confidence": `} // cut short: invalid JSON
		}
		return geminitest.DefaultReply(r)
	}))
	req, _ := render(t, "classify", "", "I was charged twice", &task.GenConfig{Temperature: ptr(0.8)})
	res, err := b.client.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Calls != 2 || len(temps) != 2 {
		t.Fatalf("%d calls (fake saw %d), want 2", res.Calls, len(temps))
	}
	if temps[1] >= temps[0] {
		t.Errorf("temperatures %v: the retry must run cooler", temps)
	}
	if err := req.Validate(res.Text); err != nil {
		t.Errorf("accepted output %q fails validation: %v", res.Text, err)
	}
	if len(b.clock.recorded()) != 0 {
		t.Errorf("a quality retry backed off %v: the model is healthy", b.clock.recorded())
	}
	if want := b.srv.Ledger().Total.Billed; res.Usage != want {
		t.Errorf("usage %+v, billed %+v: both calls must be counted", res.Usage, want)
	}
}

func TestQualityFailureAfterRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, geminitest.WithResponder(func(geminitest.Request) geminitest.Reply {
		return geminitest.Reply{Text: `{"category":"weather","confidence":0.5}`}
	}))
	req, _ := render(t, "classify", "", "x", nil)
	res, err := b.client.Generate(context.Background(), req)
	if gemini.ClassOf(err) != gemini.Quality {
		t.Fatalf("err = %v, want quality", err)
	}
	if res.Calls != 3 {
		t.Errorf("%d calls, want QualityAttempts (3)", res.Calls)
	}
}

func ptr[T any](v T) *T { return &v }
