package dlqnotifier

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/pkg/task"
)

// With push authentication configured — and without it, unless GENBOX_UNAUTHENTICATED_PUSH says
// this is local use — /pubsub/push refuses a request without a valid OIDC token before anything
// is handled: an alert that the unauthenticated route posts to Slack is
// not posted when it arrives unsigned or with a forged token.
func TestPushRefusesUnsignedRequests(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.cfg
	cfg.PushAudience, cfg.PushAccount = "genbox-dlqnotifier-push-p", "genbox-push@p.iam.gserviceaccount.com"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	guarded := httptest.NewServer(New(cfg, e.st, NewSlackClient(cfg), e.pub, nil, slog.New(slog.DiscardHandler)).Handler())
	defer guarded.Close()

	body, err := json.Marshal(map[string]any{
		"message": map[string]any{
			"data":        base64.StdEncoding.EncodeToString([]byte("worker error rate above 5%")),
			"attributes":  map[string]string{task.AttrKind: KindAlert, task.AttrAlert: "push-auth-test"},
			"messageId":   "alert-1",
			"publishTime": time.Now().UTC().Format(time.RFC3339Nano),
		},
		"subscription": "projects/p/subscriptions/" + bus.SubAlerts,
	})
	if err != nil {
		t.Fatal(err)
	}
	enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	// Well-formed, right audience and email, but unsigned: refused without fetching any key.
	forged := enc(map[string]string{"alg": "none", "typ": "JWT"}) + "." + enc(map[string]any{
		"iss": "https://accounts.google.com", "aud": cfg.PushAudience, "email": cfg.PushAccount, "email_verified": true,
		"exp": time.Now().Add(time.Hour).Unix(),
	}) + "."
	post := func(base, authorization string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+PushPath, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, authorization := range []string{"", "Basic " + testAdminKey, "Bearer " + testAdminKey, "Bearer " + forged} {
		if got := post(guarded.URL, authorization); got != http.StatusUnauthorized {
			t.Fatalf("Authorization %q: status %d, want 401", authorization, got)
		}
	}
	if n := len(e.slack.Calls("")); n != 0 {
		t.Fatalf("%d Slack calls after refused pushes", n)
	}
	// Without push authentication the route still refuses, unless local use is explicit.
	closed := e.cfg
	closed.UnauthenticatedPush = false
	failClosed := httptest.NewServer(New(closed, e.st, NewSlackClient(closed), e.pub, nil, slog.New(slog.DiscardHandler)).Handler())
	defer failClosed.Close()
	if got := post(failClosed.URL, ""); got != http.StatusUnauthorized {
		t.Fatalf("no push authentication configured: status %d, want 401", got)
	}
	// The same request is handled where local use turns push authentication off: what was
	// refused would have been acted on.
	if got := post(e.http.URL, ""); got != http.StatusNoContent {
		t.Fatalf("unauthenticated route: status %d, want 204", got)
	}
	if n := len(e.slack.Posts()); n != 1 {
		t.Fatalf("%d Slack posts, want the alert", n)
	}
}
