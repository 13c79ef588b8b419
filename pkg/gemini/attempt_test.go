package gemini_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

type ctxMark struct{}

// The attempt hook sees every call with its model, number, tokens and failure class, and its
// context reaches the call.
func TestAttemptHookSeesEveryCall(t *testing.T) {
	t.Parallel()
	srv := geminitest.NewServer()
	t.Cleanup(srv.Close)
	srv.FailNext(primary, 503, 400)
	var mu sync.Mutex
	var started, ended []gemini.Attempt
	hook := func(ctx context.Context, a gemini.Attempt) (context.Context, func(gemini.Attempt)) {
		mu.Lock()
		started = append(started, a)
		mu.Unlock()
		ctx = context.WithValue(ctx, ctxMark{}, a.Number)
		return ctx, func(a gemini.Attempt) {
			mu.Lock()
			defer mu.Unlock()
			if n, _ := ctx.Value(ctxMark{}).(int); n != a.Number {
				t.Errorf("end of attempt %d with the context of attempt %d", a.Number, n)
			}
			ended = append(ended, a)
		}
	}
	c, err := gemini.New(context.Background(), testConfig(t, srv),
		gemini.WithClock(&fakeClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}),
		gemini.WithAttemptHook(hook))
	if err != nil {
		t.Fatal(err)
	}
	// 503 (transient, retried), then 400 (permanent): the task fails after two attempts.
	res, err := c.Generate(context.Background(), request("a"))
	if gemini.ClassOf(err) != gemini.Permanent {
		t.Fatalf("Generate: %v, want a permanent failure", err)
	}
	srv.FailNext(primary)
	res2, err := c.Generate(context.Background(), request("b"))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(started) != 3 || len(ended) != 3 {
		t.Fatalf("hook saw %d starts and %d ends, want 3 each", len(started), len(ended))
	}
	want := []struct {
		task   string
		number int
		class  gemini.Class
	}{{"a", 1, gemini.Transient}, {"a", 2, gemini.Permanent}, {"b", 1, ""}}
	for i, w := range want {
		a := ended[i]
		if a.TaskID != w.task || a.Number != w.number || a.Class != w.class || a.Model != primary || a.Tenant != "t1" {
			t.Errorf("attempt %d = %+v, want task %s number %d class %q on %s", i, a, w.task, w.number, w.class, primary)
		}
		if (a.Err == nil) != (w.class == "") {
			t.Errorf("attempt %d error %v with class %q", i, a.Err, a.Class)
		}
	}
	if ended[2].Usage != res2.Usage || ended[2].CostUSD != res2.CostUSD || ended[2].Usage.OutputTokens == 0 {
		t.Errorf("successful attempt usage %+v cost %g, want the result's %+v %g", ended[2].Usage, ended[2].CostUSD, res2.Usage, res2.CostUSD)
	}
	if ended[0].Usage.TotalTokens != 0 || res.Calls != 2 {
		t.Errorf("failed attempt billed %+v (calls %d), want nothing", ended[0].Usage, res.Calls)
	}
}
