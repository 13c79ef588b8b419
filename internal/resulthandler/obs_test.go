package resulthandler

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/internal/ssrf"
)

// Not parallel: it installs global telemetry. Each POST is a "webhook POST" span of its task and
// an attempt metered by outcome; a retry is counted by class; every log line carries task_id.
//
//nolint:paralleltest // it installs global telemetry
func TestWebhookAttemptsAreTracedAndMetered(t *testing.T) {
	tel := obstest.Install(t)
	e := setup(t)
	var logs obstest.Buffer
	h, err := New(e.st, e.st, e.pub, ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true, Timeout: time.Second}),
		obs.NewLogger(&logs, slog.LevelDebug, obs.LogOptions{}), e.policy, WithMetrics(tel.Metrics))
	if err != nil {
		t.Fatal(err)
	}
	h.Rand = func() float64 { return 1 }
	e.h = h
	e.recv.Schedule = func(n int) int {
		if n == 1 {
			return http.StatusBadGateway
		}
		return http.StatusOK
	}
	tk := e.finishedTask(t, "t-obs", e.recv.URL())
	e.handle(tk.ID)
	e.clock.Set(e.clock.Now().Add(e.policy.BackoffMax))
	e.handle(tk.ID)

	spans := tel.TaskSpans(tk.ID)
	if len(spans) != 2 || spans[0].Name() != "webhook POST" || spans[1].Name() != "webhook POST" {
		t.Fatalf("task spans %v, want two webhook POSTs", obstest.Names(spans))
	}
	if st, _ := obstest.Attr(spans[0], "http.response.status_code"); st.AsInt64() != http.StatusBadGateway || spans[0].Status().Code != codes.Error {
		t.Errorf("first POST: status %v, span status %v; want 502 and an error", st.AsInt64(), spans[0].Status())
	}
	if cls, _ := obstest.Attr(spans[0], obs.SpanErrorType); cls.AsString() != "retry" {
		t.Errorf("first POST error.type %q, want retry", cls.AsString())
	}
	if spans[1].Status().Code == codes.Error {
		t.Errorf("delivered POST marked failed: %v", spans[1].Status())
	}
	for outcome, want := range map[string]float64{"retry": 1, "delivered": 1, "dead": 0} {
		if got := tel.Sum(t, obs.MetricWebhookAttempts, "outcome="+outcome); got != want {
			t.Errorf("%s{outcome=%s} = %g, want %g", obs.MetricWebhookAttempts, outcome, got, want)
		}
		if got := tel.Sum(t, obs.MetricWebhookLatency, "outcome="+outcome); got != want {
			t.Errorf("%s{outcome=%s} count = %g, want %g", obs.MetricWebhookLatency, outcome, got, want)
		}
	}
	if got := tel.Sum(t, obs.MetricRetries, "class="+RetryClassDelivery); got != 1 {
		t.Errorf("%s{class=delivery} = %g, want 1", obs.MetricRetries, got)
	}
	lines := logs.Lines()
	if len(lines) == 0 {
		t.Fatal("nothing logged")
	}
	for _, l := range lines {
		if strings.Count(l, `"task_id":"t-obs"`) != 1 {
			t.Errorf("line without exactly one task_id: %s", l)
		}
	}
}
