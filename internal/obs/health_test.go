package obs

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestReady(t *testing.T) {
	t.Parallel()
	var pull Running
	slow := Check{Name: "slow", Probe: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}
	ok := Check{Name: "firestore", Probe: func(context.Context) error { return nil }}
	down := Check{Name: "firestore", Probe: func(context.Context) error { return errors.New("unreachable") }}
	for _, tc := range []struct { //nolint:paralleltest // the cases share one consumer flag, set per case
		name   string
		checks []Check
		on     bool
		code   int
		failed []string
	}{
		{"all pass", []Check{ok, pull.Check("pull")}, true, 200, nil},
		{"consumer stopped", []Check{ok, pull.Check("pull")}, false, 503, []string{"pull"}},
		{"dependency down", []Check{down}, true, 503, []string{"firestore"}},
		{"probe past the timeout", []Check{ok, slow}, true, 503, []string{"slow"}},
		{"no checks", nil, false, 200, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pull.Set(tc.on, "shutting down")
			w := httptest.NewRecorder()
			Ready(50*time.Millisecond, tc.checks...).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			var body Readiness
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if w.Code != tc.code || len(body.Failed) != len(tc.failed) {
				t.Fatalf("answer %d %+v, want %d failing %v", w.Code, body, tc.code, tc.failed)
			}
			for _, n := range tc.failed {
				if body.Failed[n] == "" {
					t.Errorf("failed check %s not named: %+v", n, body)
				}
			}
		})
	}
}
