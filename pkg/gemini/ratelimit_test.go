package gemini_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// loadResult is what a load run measured.
type loadResult struct {
	refused  int     // calls the fake answered 429
	fraction float64 // achieved share of the limit, after the first window
}

// load drives a model limited by the fake at limits, through a client configured with the same
// limits, with workers concurrent callers for windows rate windows.
func load(tb testing.TB, limits geminitest.Limits, windows, workers, promptBytes int) loadResult {
	tb.Helper()
	var mu sync.Mutex
	var admitted []time.Time
	var tokens []int64
	srv := geminitest.NewServer(geminitest.WithLimits(primary, limits), geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		mu.Lock()
		admitted = append(admitted, time.Now())
		tokens = append(tokens, r.PromptTokens())
		mu.Unlock()
		return geminitest.Reply{Text: "ok"}
	}))
	defer srv.Close()
	cfg := testConfig(tb, srv)
	cfg.Models = []string{primary}
	cfg.RateWindow = limits.Window
	if limits.RPM > 0 {
		cfg.RPM = map[string]float64{primary: float64(limits.RPM)}
	}
	if limits.TPM > 0 {
		cfg.TPM = map[string]float64{primary: float64(limits.TPM)}
	}
	c, err := gemini.New(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(time.Duration(windows)*limits.Window))
	defer cancel()
	prompt := strings.Repeat("w", promptBytes)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = c.Generate(ctx, gemini.Request{Tenant: "t", Prompt: prompt})
			}
		})
	}
	wg.Wait()
	end := time.Now()
	mu.Lock()
	defer mu.Unlock()
	from := start.Add(limits.Window)
	var n, tok int64
	for i, at := range admitted {
		if at.After(from) {
			n++
			tok += tokens[i]
		}
	}
	steady := end.Sub(from).Seconds() / limits.Window.Seconds()
	res := loadResult{refused: srv.Ledger().Model(primary).Failed}
	if limits.RPM > 0 {
		res.fraction = float64(n) / (steady * float64(limits.RPM))
	} else {
		res.fraction = float64(tok) / (steady * float64(limits.TPM))
	}
	return res
}

// The fractions asserted here are generous floors for a loaded 2-core machine under -race;
// BenchmarkRateLimits reports the precise ones.
func TestRequestsPerMinuteWithoutThrottling(t *testing.T) {
	t.Parallel()
	r := load(t, geminitest.Limits{RPM: 100, Window: 2 * time.Second}, 3, 8, 40)
	if r.refused != 0 {
		t.Errorf("the client caused %d 429s", r.refused)
	}
	if r.fraction < 0.75 || r.fraction > 1 {
		t.Errorf("achieved %.3f of the RPM limit", r.fraction)
	}
	t.Logf("RPM: %.3f of the limit, %d refused", r.fraction, r.refused)
}

func TestTokensPerMinuteWithoutThrottling(t *testing.T) {
	t.Parallel()
	// 100 prompt tokens a call, 10000 a window: 100 calls a window at most.
	r := load(t, geminitest.Limits{TPM: 10000, Window: 2 * time.Second}, 3, 8, 400)
	if r.refused != 0 {
		t.Errorf("the client caused %d 429s", r.refused)
	}
	if r.fraction < 0.75 || r.fraction > 1 {
		t.Errorf("achieved %.3f of the TPM limit", r.fraction)
	}
	t.Logf("TPM: %.3f of the limit, %d refused", r.fraction, r.refused)
}

// BenchmarkRateLimits reports the achieved fraction of each limit and the 429s the client caused
// (run with -benchtime=1x; each run lasts several rate windows).
func BenchmarkRateLimits(b *testing.B) {
	for _, tc := range []struct {
		name   string
		limits geminitest.Limits
		prompt int
	}{
		{"rpm", geminitest.Limits{RPM: 100, Window: 2 * time.Second}, 40},
		{"tpm", geminitest.Limits{TPM: 10000, Window: 2 * time.Second}, 400},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var r loadResult
			for b.Loop() {
				r = load(b, tc.limits, 5, 8, tc.prompt)
			}
			b.ReportMetric(r.fraction, "fraction_of_limit")
			b.ReportMetric(float64(r.refused), "429s")
		})
	}
}
