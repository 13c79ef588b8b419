package obs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReady(t *testing.T) {
	t.Parallel()
	var pull Running
	slow := Check{Name: "slow", Probe: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}
	ok := Check{Name: "firestore", Probe: func(context.Context) error { return nil }}
	const raw = "rpc error: dial tcp 10.128.0.7:443: connect: connection refused (project secret-project-42)"
	down := Check{Name: "firestore", Probe: func(context.Context) error { return errors.New(raw) }}
	for _, tc := range []struct { //nolint:paralleltest // the cases share one consumer flag, set per case
		name   string
		checks []Check
		on     bool
		code   int
		failed map[string]string
	}{
		{"all pass", []Check{ok, pull.Check("pull")}, true, 200, nil},
		{"consumer stopped", []Check{ok, pull.Check("pull")}, false, 503, map[string]string{"pull": FailedError}},
		{"dependency down", []Check{down}, true, 503, map[string]string{"firestore": FailedError}},
		{"probe past the timeout", []Check{ok, slow}, true, 503, map[string]string{"slow": FailedTimeout}},
		{"no checks", nil, false, 200, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pull.Set(tc.on, "shutting down")
			var logged bytes.Buffer
			w := httptest.NewRecorder()
			Ready(slog.New(slog.NewTextHandler(&logged, nil)), 50*time.Millisecond, tc.checks...).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			var body Readiness
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if w.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.code, w.Body)
			}
			if diff := cmp.Diff(tc.failed, body.Failed); diff != "" {
				t.Fatalf("failed checks (-want +got):\n%s", diff)
			}
			if strings.Contains(w.Body.String(), "10.128.0.7") || strings.Contains(w.Body.String(), "shutting down") {
				t.Fatalf("the answer carries a probe's own error: %s", w.Body)
			}
			for name := range tc.failed {
				if !strings.Contains(logged.String(), "check="+name) {
					t.Errorf("failed check %s not logged: %s", name, logged.String())
				}
			}
			if tc.name == "dependency down" && !strings.Contains(logged.String(), "10.128.0.7") {
				t.Errorf("the probe's error is not in the log: %s", logged.String())
			}
		})
	}
}
