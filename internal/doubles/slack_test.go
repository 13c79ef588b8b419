package doubles_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/doubles"
)

// slack-go pointed at the double posts, updates and posts ephemerally as it would to Slack; the
// double records each call, keeps each message's latest version, refuses another token and fails
// what SetFail says.
func TestSlack(t *testing.T) {
	t.Parallel()
	d := &doubles.Slack{Token: "xoxb-t"}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	api := slack.New("xoxb-t", slack.OptionAPIURL(srv.URL+"/api/"))
	ctx := context.Background()

	ch, ts, err := api.PostMessageContext(ctx, "C1", slack.MsgOptionText("first", false))
	if err != nil || ch != "C1" || ts == "" {
		t.Fatalf("post: %q %q %v", ch, ts, err)
	}
	if _, _, _, err := api.UpdateMessageContext(ctx, "C1", ts, slack.MsgOptionText("edited", false)); err != nil {
		t.Fatal(err)
	}
	if m, ok := d.Message("C1", ts); !ok || m.Method != "chat.update" || m.Form.Get("text") != "edited" {
		t.Errorf("message %s: %+v %v, want its update", ts, m, ok)
	}
	if _, err := api.PostEphemeralContext(ctx, "C1", "U1", slack.MsgOptionText("only you", false)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := slack.New("xoxb-other", slack.OptionAPIURL(srv.URL+"/api/")).PostMessageContext(ctx, "C1"); err == nil || err.Error() != "invalid_auth" {
		t.Errorf("another token: %v, want invalid_auth", err)
	}
	d.SetFail(func(method string, n int) bool { return method == "chat.postMessage" && n == 3 })
	if _, _, err := api.PostMessageContext(ctx, "C1", slack.MsgOptionText("lost", false)); err == nil {
		t.Error("the failed post succeeded")
	}
	var got []string
	for _, c := range d.Calls("") {
		got = append(got, c.Method+" "+c.Error)
	}
	want := []string{"chat.postMessage ", "chat.update ", "chat.postEphemeral ", "chat.postMessage invalid_auth", "chat.postMessage http 500"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if posts := d.Posts(); len(posts) != 1 || posts[0].TS != ts {
		t.Errorf("accepted posts %+v, want the first only", posts)
	}
}

// A held post reaches Slack and waits there until it is released.
func TestSlackHoldNextPost(t *testing.T) {
	t.Parallel()
	d := &doubles.Slack{}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	api := slack.New("xoxb-t", slack.OptionAPIURL(srv.URL+"/api/"))
	arrived, release := d.HoldNextPost()
	done := make(chan error, 1)
	go func() {
		_, _, err := api.PostMessageContext(context.Background(), "C1", slack.MsgOptionText("held", false))
		done <- err
	}()
	<-arrived
	select {
	case err := <-done:
		t.Fatalf("the held post was answered: %v", err)
	default:
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.WaitCall(ctx, func(c doubles.SlackCall) bool { return c.Form.Get("text") == "held" }); err != nil {
		t.Fatal(err)
	}
}
