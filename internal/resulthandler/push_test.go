package resulthandler

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The push route refuses a request without a valid OIDC token before the handler sees it, with
// push authentication set and also without it (fail closed); only the explicit local-use
// setting lets the same request reach the handler.
func TestPushHandlerVerifiesWhenConfigured(t *testing.T) {
	t.Parallel()
	body, err := json.Marshal(map[string]any{
		"message":      map[string]any{"attributes": map[string]string{task.AttrTaskID: "t-1"}, "messageId": "m-1"},
		"subscription": "projects/p/subscriptions/" + bus.SubResults,
	})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	secured := Config{PushAudience: "genbox-resulthandler-push-p", PushAccount: "genbox-push@p.iam.gserviceaccount.com"}
	for _, tc := range []struct {
		name          string
		cfg           Config
		authorization string
		want          int
	}{
		{"no push auth: refused", Config{}, "", http.StatusUnauthorized},
		{"no push auth, local use: handled", Config{UnauthenticatedPush: true}, "", http.StatusNoContent},
		{"push auth and local use: verified", Config{PushAudience: secured.PushAudience, PushAccount: secured.PushAccount, UnauthenticatedPush: true}, "", http.StatusUnauthorized},
		{"no token", secured, "", http.StatusUnauthorized},
		{"not a JWT", secured, "Bearer opaque-token", http.StatusUnauthorized},
		{"not Bearer", secured, "Basic dXNlcjpwYXNz", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var handled atomic.Int64
			h := PushHandler(bus.HandlerFunc(func(context.Context, *bus.Message) bus.Result {
				handled.Add(1)
				return bus.Ack
			}), tc.cfg, log)
			req := httptest.NewRequest(http.MethodPost, PushPath, strings.NewReader(string(body)))
			if tc.authorization != "" {
				req.Header.Set("Authorization", tc.authorization)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.want, rec.Body)
			}
			want := int64(0)
			if tc.want == http.StatusNoContent {
				want = 1
			}
			if handled.Load() != want {
				t.Fatalf("handled %d times, want %d", handled.Load(), want)
			}
		})
	}
}
