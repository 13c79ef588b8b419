package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/console"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// decisions records who each decision was made by, and decides nothing.
type decisions struct {
	mu sync.Mutex
	by []string
}

func (d *decisions) Decide(_ context.Context, id string, _ dlqnotifier.Action, by string) (*store.DeadLetter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.by = append(d.by, by)
	return &store.DeadLetter{ID: id}, nil
}

func (d *decisions) all() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.by...)
}

// noEstimate prices nothing.
type noEstimate struct{}

func (noEstimate) EstimateUSD(*protocol.Task) (float64, bool) { return 0, false }

// consoleOn serves a console under adminKey on st, as one revision of the dlqnotifier does,
// behind Cloud Run's front end (one trusted hop); it returns its base URL.
func consoleOn(t *testing.T, st *store.Store, adminKey string, d console.Decider) string {
	t.Helper()
	families, err := prompts.Default()
	if err != nil {
		t.Fatal(err)
	}
	con, err := console.New(console.Config{AdminKey: adminKey, ProxyHops: 1}, console.Deps{Store: st, Decider: d, Estimator: noEstimate{},
		Prompts: families})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(con)
	t.Cleanup(hs.Close)
	return hs.URL
}

// loginLink asks base for a one-time login link with adminKey for operator, and returns it.
func loginLink(t *testing.T, base, adminKey, operator string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+console.LoginTokenPath, strings.NewReader(`{"operator":"`+operator+`"}`))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out console.LoginTokenResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("login token: %d %v", resp.StatusCode, err)
	}
	return out.URL
}

const (
	adminKey   = "console-admin-key-0123456789"
	rotatedKey = "console-admin-key-rotated-0123"
)

// A console decision is recorded as the admin key's that issued the session, with the name the
// login-token request gave kept beside it as what the caller said — as the admin routes record
// theirs, not as the name alone.
func TestDecisionsRecordTheKeyThatIssuedTheSession(t *testing.T) {
	t.Parallel()
	st := store.New(testenv.Firestore(t, emulator.ProjectID(t)))
	d := &decisions{}
	base := consoleOn(t, st, adminKey, d)
	c := browser(t)
	csrf := login(t, c, loginLink(t, base, adminKey, "alice"))
	if code, _ := post(t, c, base+"/console/dead-letters/t1:delivery:0:0", url.Values{"action": {"discard"}, "csrf": {csrf}}); code != http.StatusSeeOther {
		t.Fatalf("decision: %d, want 303", code)
	}
	want := httpapi.NewAdminKey(adminKey).Says("alice")
	if diff := cmp.Diff([]string{want}, d.all()); diff != "" {
		t.Errorf("decided by (-want +got):\n%s", diff)
	}
}

// Rotating the admin key ends the sessions and the unredeemed login links the old key issued:
// a console under the new key (the next revision) refuses both.
func TestRotatedAdminKeyEndsSessionsAndLinks(t *testing.T) {
	t.Parallel()
	st := store.New(testenv.Firestore(t, emulator.ProjectID(t)))
	d := &decisions{}
	old := consoleOn(t, st, adminKey, d)
	c := browser(t)
	login(t, c, loginLink(t, old, adminKey, "alice"))
	unredeemed := loginLink(t, old, adminKey, "bob")

	rotated := consoleOn(t, st, rotatedKey, d)
	if code, body := get(t, c, rotated+console.Prefix); code != http.StatusUnauthorized || strings.Contains(body, `name="csrf"`) {
		t.Errorf("a session of the old key under the new one: %d, want 401 and no page", code)
	}
	if code, _ := get(t, browser(t), rotated+strings.TrimPrefix(unredeemed, old)); code != http.StatusUnauthorized {
		t.Errorf("a login link of the old key under the new one: %d, want 401", code)
	}
	c = browser(t)
	login(t, c, loginLink(t, rotated, rotatedKey, "alice")) // the new key's own work
}

// Forged login links and session cookies are failed credentials like any other: past a
// client's burst they are answered 429 with Retry-After, while a valid session from that same
// address is served.
func TestFailedLoginLinksAndCookiesThrottled(t *testing.T) {
	t.Parallel()
	st := store.New(testenv.Firestore(t, emulator.ProjectID(t)))
	at := time.Now() // the limiter reads the store's clock: stopped, no failure is forgiven mid-test
	st.Now = func() time.Time { return at }
	base := consoleOn(t, st, adminKey, &decisions{})
	c := browser(t)
	login(t, c, loginLink(t, base, adminKey, "alice"))
	send := func(path, from, cookie string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header.Set("X-Forwarded-For", from)
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: "genbox_console", Value: cookie})
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Fatal("a 429 without Retry-After")
		}
		return resp.StatusCode
	}
	burst := authlimit.DefaultConfig().ClientBurst
	const extra = 5
	links, cookies := map[int]int{}, map[int]int{}
	for i := range burst + extra {
		links[send(console.LoginPath+"?token=forged-"+string(rune('a'+i)), "203.0.113.1", "")]++
		cookies[send(console.Prefix, "203.0.113.2", "forged-session-"+string(rune('a'+i)))]++
	}
	want := map[int]int{http.StatusUnauthorized: burst, http.StatusTooManyRequests: extra}
	if diff := cmp.Diff(want, links); diff != "" {
		t.Errorf("forged login links (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, cookies); diff != "" {
		t.Errorf("forged session cookies (-want +got):\n%s", diff)
	}
	req, _ := http.NewRequest(http.MethodGet, base+console.Prefix, nil)
	req.Header.Set("X-Forwarded-For", "203.0.113.2")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a valid session from the throttled address: %d, want 200", resp.StatusCode)
	}
}
