package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A problem is written byte for byte as docs/api.md shows it: problem+json, its length, a final
// newline, Retry-After rounded up; a 5xx is logged with its cause and a 4xx is not.
func TestError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		p          *task.Problem
		wantBody   string
		wantHeader http.Header
		wantLogged bool
	}{
		{name: "field problem",
			p:        httpapi.Problem(400, httpapi.TypeInvalid, "input: is required", task.FieldError{Field: "input", Detail: "is required"}),
			wantBody: `{"type":"https://genbox.dev/problems/invalid-request","title":"Bad Request","status":400,"detail":"input: is required","errors":[{"field":"input","detail":"is required"}]}` + "\n"},
		{name: "retry after", p: func() *task.Problem {
			p := httpapi.Problem(503, httpapi.TypeUnavailable, "retry")
			p.RetryAfter = 1500 * time.Millisecond
			return p
		}(),
			wantBody:   `{"type":"https://genbox.dev/problems/unavailable","title":"Service Unavailable","status":503,"detail":"retry"}` + "\n",
			wantHeader: http.Header{"Retry-After": {"2"}}, wantLogged: true},
		{name: "by status", p: httpapi.StatusProblem(413, "too big"),
			wantBody: `{"type":"https://genbox.dev/problems/body-too-large","title":"Request Entity Too Large","status":413,"detail":"too big"}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logged bytes.Buffer
			rec := httptest.NewRecorder()
			httpapi.Error(rec, httptest.NewRequest("GET", "/x", nil), slog.New(slog.NewTextHandler(&logged, nil)), tc.p, errors.New("the cause"))
			if diff := cmp.Diff(tc.wantBody, rec.Body.String()); diff != "" || rec.Code != tc.p.Status {
				t.Errorf("status %d, body (-want +got):\n%s", rec.Code, diff)
			}
			want := http.Header{"Content-Type": {task.ProblemContentType}, "Content-Length": {strconv.Itoa(len(tc.wantBody))}}
			for k, v := range tc.wantHeader {
				want[k] = v
			}
			if diff := cmp.Diff(want, rec.Header()); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			if got := strings.Contains(logged.String(), "the cause"); got != tc.wantLogged {
				t.Errorf("cause logged: %v, want %v (%q)", got, tc.wantLogged, logged.String())
			}
		})
	}
}

func TestBearer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		header, want string
		ok           bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer  abc ", "abc", true},
		{"BEARER abc", "abc", true},
		{"Bearer ", "", false},
		{"Bearer    ", "", false},
		{"Basic abc", "", false},
		{"Bearerabc", "", false},
		{"", "", false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", tc.header)
		if got, ok := httpapi.Bearer(r); got != tc.want || ok != tc.ok {
			t.Errorf("Bearer(%q) = %q, %v; want %q, %v", tc.header, got, ok, tc.want, tc.ok)
		}
	}
}

// The admin key check answers as the publisher always has: 403 when off, 401 without a Bearer
// credential, 403 for a wrong key (counted, and throttled to 429 past the burst), nil for the
// key, however many wrong ones came before it.
// An admin key's holder is recorded by the key, with the name it gives marked as only said.
func TestAdminKeySays(t *testing.T) {
	t.Parallel()
	k := httpapi.NewAdminKey("0123456789abcdef-admin")
	for name, want := range map[string]string{
		" alice ":    k.Operator() + ` (says "alice")`,
		`"root" <x>`: k.Operator() + ` (says "\"root\" <x>")`,
		"   ":        k.Operator(),
		"":           k.Operator(),
	} {
		if got := k.Says(name); got != want {
			t.Errorf("Says(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestAdminKey(t *testing.T) {
	t.Parallel()
	const key = "0123456789abcdef-admin"
	fails := authlimit.New(authlimit.Config{PerClient: 0.001, ClientBurst: 2, Global: 1000, GlobalBurst: 1000, MaxClients: 10}, time.Now)
	check := func(k httpapi.AdminKey, header string) int {
		r := httptest.NewRequest("GET", "/admin", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		if p := k.Authorize(r, fails); p != nil {
			return p.Status
		}
		return 0
	}
	k := httpapi.NewAdminKey(key)
	got := []int{
		check(httpapi.NewAdminKey(""), "Bearer "+key),
		check(k, ""),
		check(k, "bearer "+key),
		check(k, "Bearer "+key+"x"),
		check(k, "Bearer "+key[:len(key)-1]),
		check(k, "Bearer wrong-"+key), // throttled: the burst of two is spent
		check(k, "Bearer "+key),       // the right key is never throttled
	}
	if diff := cmp.Diff([]int{403, 401, 0, 403, 403, 429, 0}, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if op := k.Operator(); !strings.HasPrefix(op, "admin key ") || strings.Contains(op, key) || op == httpapi.NewAdminKey(key+"2").Operator() {
		t.Errorf("Operator() = %q, want the key named by a digest that tells keys apart", op)
	}
	if httpapi.CheckAdminKey("short") == nil || httpapi.CheckAdminKey("") != nil || httpapi.CheckAdminKey(key) != nil {
		t.Error("CheckAdminKey: want only a set key under 16 characters refused")
	}
}

// Every service maps its errors through ProblemFor: a problem stands, a service's own error gets
// its own answer, an oversized body 413, a store outage or timeout 503 with a Retry-After (so a
// client retries the dlqnotifier's admin routes as it does the publisher's), anything else 500.
func TestProblemFor(t *testing.T) {
	t.Parallel()
	errMine := errors.New("mine")
	own := func(err error) *task.Problem {
		if errors.Is(err, errMine) {
			return httpapi.Problem(http.StatusConflict, httpapi.TypeConflict, err.Error())
		}
		return nil
	}
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantRetry  time.Duration
	}{
		{"a problem", fmt.Errorf("decode: %w", httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "x")), http.StatusBadRequest, 0},
		{"the service's own", fmt.Errorf("decide: %w", errMine), http.StatusConflict, 0},
		{"body too large", &http.MaxBytesError{Limit: 10}, http.StatusRequestEntityTooLarge, 0},
		{"store unavailable", fmt.Errorf("read: %w", status.Error(codes.Unavailable, "down")), http.StatusServiceUnavailable, time.Second},
		{"store timed out", fmt.Errorf("read: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, time.Second},
		{"contended", status.Error(codes.Aborted, "contention"), http.StatusServiceUnavailable, time.Second},
		{"anything else", errors.New("boom"), http.StatusInternalServerError, 0},
	}
	for _, tc := range tests {
		p := httpapi.ProblemFor(tc.err, own)
		if p.Status != tc.wantStatus || p.RetryAfter != tc.wantRetry {
			t.Errorf("%s: %d (Retry-After %s), want %d (Retry-After %s)", tc.name, p.Status, p.RetryAfter, tc.wantStatus, tc.wantRetry)
		}
	}
	if p := httpapi.ProblemFor(errMine, nil); p.Status != http.StatusInternalServerError {
		t.Errorf("without a mapping of its own: %d, want 500", p.Status)
	}
}
