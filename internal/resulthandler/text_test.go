package resulthandler

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/safetext"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// doerFunc answers deliveries without a network.
type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// TestHugeRedirectTargetIsDeadLetteredOnce drives a receiver that answers 302 with a Location of
// 3 MiB (past what the SSRF client lets through, so whatever text reaches the record is bounded
// by the handler and the store, not by the client). Unbounded, the error makes the task document
// pass Firestore's 1 MiB, the record fails, and the delivery is re-claimed every lease forever;
// bounded, it is dead after one POST with exactly one DLQ notice, and neither the task nor the
// log lines carry the text or the callback's token.
func TestHugeRedirectTargetIsDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var posts atomic.Int64
	client := doerFunc(func(r *http.Request) (*http.Response, error) {
		posts.Add(1)
		h := http.Header{}
		h.Set("Location", "https://evil.example/next?q="+strings.Repeat("x", 3<<20))
		return &http.Response{StatusCode: http.StatusFound, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})
	logs := &bytes.Buffer{}
	h, err := New(e.st, e.st, e.pub, client, slog.New(slog.NewJSONHandler(logs, nil)), e.policy)
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	tk := e.finishedTask(t, "t-huge-location", "https://app.example/hook?token=s3cret")
	for range 3 { // then past the delivery lease, twice
		e.handle(tk.ID)
		e.clock.Set(e.clock.Now().Add(time.Hour))
	}
	got := testenv.GetTask(t, e.st, tk.ID)
	d := got.Delivery
	if d.State != task.DeliveryDead || d.Attempts != 1 || posts.Load() != 1 {
		t.Fatalf("delivery %s after %d attempts and %d POSTs, want dead after 1 (record error: %s)", d.State, d.Attempts, posts.Load(), firstLine(logs.String(), "record outcome"))
	}
	if n := len(e.pub.On(bus.TopicResultsDLQ)); n != 1 || len(got.Notices) != 1 {
		t.Fatalf("%d DLQ notices published, %d on the task; want 1", n, len(got.Notices))
	}
	if len(d.LastError) > safetext.MaxError || !strings.Contains(d.LastError, "https://evil.example/next"+safetext.Redacted) {
		t.Errorf("last error of %d bytes %q, want at most %d naming the redirect target without its query", len(d.LastError), d.LastError[:min(len(d.LastError), 120)], safetext.MaxError)
	}
	if n := logs.Len(); n > 8<<10 || strings.Contains(logs.String(), "s3cret") {
		t.Errorf("logs: %d bytes, token logged %t; want a few KiB without the token", n, strings.Contains(logs.String(), "s3cret"))
	}
}

// firstLine returns the first line of s that contains sub, shortened.
func firstLine(s, sub string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			return line[:min(len(line), 300)]
		}
	}
	return ""
}
