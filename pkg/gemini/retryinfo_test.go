package gemini_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// A RetryInfo delay longer than the in-process wait reaches the caller on the returned *Error,
// whichever model of the chain asked for it, so that a reschedule never comes back to that model
// sooner; RateLimited says that every call was turned away by a quota (nothing answered, nothing
// billed).
func TestRetryInfoReachesTheCaller(t *testing.T) {
	t.Parallel()
	const long = 40 * time.Second // above the default in-process wait of 30 s
	tests := []struct {
		name            string
		primary         geminitest.Reply
		fallback        geminitest.Reply
		wantMin         time.Duration
		wantRateLimited bool
	}{
		{"both rate limited", geminitest.Reply{Code: http.StatusTooManyRequests, RetryDelay: long},
			geminitest.Reply{Code: http.StatusTooManyRequests, RetryDelay: long + 10*time.Second}, long + 10*time.Second, true},
		{"the primary's delay outlives the fallback's outage", geminitest.Reply{Code: http.StatusTooManyRequests, RetryDelay: long},
			geminitest.Reply{Code: http.StatusServiceUnavailable}, long - 5*time.Second, false},
		{"a 429 without RetryInfo", geminitest.Reply{Code: http.StatusTooManyRequests},
			geminitest.Reply{Code: http.StatusServiceUnavailable}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *gemini.Config) { c.MaxAttempts = 4 }, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
				if r.Model == primary {
					return tc.primary
				}
				return tc.fallback
			}))
			_, err := b.client.Generate(context.Background(), request("ri"))
			var ge *gemini.Error
			if !errors.As(err, &ge) {
				t.Fatalf("err = %v, want a *gemini.Error", err)
			}
			if ge.RetryAfter < tc.wantMin || ge.RetryAfter > tc.wantMin+10*time.Second {
				t.Errorf("RetryAfter %s, want at least %s (the longest delay still running)", ge.RetryAfter, tc.wantMin)
			}
			if ge.RateLimited != tc.wantRateLimited {
				t.Errorf("RateLimited %v, want %v", ge.RateLimited, tc.wantRateLimited)
			}
		})
	}
}
