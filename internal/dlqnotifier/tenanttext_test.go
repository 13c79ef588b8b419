package dlqnotifier

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// TestReceiverTextCannotPingOrLink drives a receiver that answers `302 Location: <!channel>
// <https://evil|Approve>` end to end: the resulthandler (through the SSRF client) refuses the
// redirect at once and kills the delivery, its DLQ notice reaches the dlqnotifier, and the Slack double gets the dead letter's
// message. The receiver's text is in it, escaped: it pings nobody and draws no link beside the
// buttons.
func TestReceiverTextCannotPingOrLink(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const location = "<!channel> <https://evil|Approve>"
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", location)
		w.WriteHeader(http.StatusFound)
	}))
	t.Cleanup(recv.Close)
	testenv.Tenant(t, e.st, testTenant)
	rpub := &testenv.Publisher{}
	rh, err := resulthandler.New(e.st, e.st, rpub,
		ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true, Timeout: 2 * time.Second}),
		slog.New(slog.DiscardHandler), resulthandler.Policy{Owner: "rh-1", Timeout: 2 * time.Second, Horizon: time.Minute,
			BackoffMin: time.Second, BackoffMax: 10 * time.Second, NoticeGrace: time.Minute, LogEntries: 20})
	if err != nil {
		t.Fatal(err)
	}
	now := e.clock.Now()
	tk := &protocol.Task{ID: "t-evil-location", Tenant: testTenant, Family: "summarize", Variant: "default", Input: "x",
		CallbackURL: recv.URL + "/hook", State: task.StateRunning, CreatedAt: now}
	tk.Output, tk.OutputAt = "a summary", &now
	tk.Finish(task.StateSucceeded, now)
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
	// Go's client cannot parse that Location; the SSRF client refuses the redirect before it
	// tries, so the first attempt kills the delivery, quoting it.
	rh.Handle(e.ctx, &bus.Message{ID: "r-1", Attributes: map[string]string{task.AttrTaskID: tk.ID}})
	notices := rpub.On(bus.TopicResultsDLQ)
	if len(notices) != 1 {
		t.Fatalf("%d DLQ notices published, want 1 (delivery %+v)", len(notices), testenv.GetTask(t, e.st, tk.ID).Delivery)
	}
	e.svc.Handle(e.ctx, &bus.Message{ID: "n-1", Attributes: notices[0].Attrs})

	posts := e.slack.Posts()
	if len(posts) != 1 {
		t.Fatalf("%d Slack posts, want 1", len(posts))
	}
	text := textOf(t, posts[0])
	if !strings.Contains(text, "&lt;!channel&gt; &lt;https://evil|Approve&gt;") {
		t.Errorf("the message does not show the receiver's Location, escaped:\n%s", text)
	}
	for _, markup := range []string{"<!channel>", "<https://", "<!", "<@", "|Approve>"} {
		if strings.Contains(text, markup) || strings.Contains(posts[0].Form.Get("text"), markup) {
			t.Errorf("the message carries %q:\n%s\nfallback: %s", markup, text, posts[0].Form.Get("text"))
		}
	}
	if strings.ContainsAny(text, "<>") {
		t.Errorf("the message carries an angle bracket, so Slack markup:\n%s", text)
	}
}
