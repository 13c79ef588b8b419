package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/console"
	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// deadDelivery submits a task whose webhook goes to a route that answers 404 — a final answer —
// so that its delivery dies, and returns the task and its dead letter once it is open and posted.
func deadDelivery(t *testing.T, ctx context.Context, s *devstack.Stack) (string, string) {
	t.Helper()
	res, err := client.New(s.Info.Publisher, s.Info.APIKey).Submit(ctx, task.Request{Family: "summarize",
		Input: "a webhook that nobody takes", CallbackURL: s.Info.DLQ + "/no-such-receiver"})
	if err != nil {
		t.Fatal(err)
	}
	dl := res.TaskID + ":delivery:0:0:" + task.EventID(res.TaskID, task.EventSucceeded, 0)[len(res.TaskID)+1:]
	s.WaitDeadLetterNotified(t, ctx, dl)
	return res.TaskID, dl
}

// browser is an HTTP client that keeps cookies and does not follow redirects.
func browser(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, c *http.Client, u string, form url.Values) (int, http.Header) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// login follows the stack's console URL and returns the session's CSRF token.
func login(t *testing.T, c *http.Client, loginURL string) string {
	t.Helper()
	resp, err := c.Get(loginURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != console.Prefix {
		t.Fatalf("login: %d to %q, want 303 to %s", resp.StatusCode, resp.Header.Get("Location"), console.Prefix)
	}
	ck := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"HttpOnly", "SameSite=Strict", "Path=/console"} {
		if !strings.Contains(ck, want) {
			t.Errorf("session cookie %q lacks %s", ck, want)
		}
	}
	base := loginURL[:strings.Index(loginURL, console.LoginPath)]
	code, body := get(t, c, base+console.Prefix)
	m := csrfField.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("overview after login: %d, no CSRF token:\n%s", code, body)
	}
	return m[1]
}

// No console route answers without a session (none, or one that does not exist), and the login
// link works once.
func TestEveryRouteNeedsASession(t *testing.T) {
	t.Parallel()
	s := devstack.StartTest(t, nil)
	base := s.Info.DLQ
	id := strings.Repeat("a", 32)
	routes := []struct{ method, path string }{
		{"GET", "/console/"}, {"GET", "/console/tasks"}, {"GET", "/console/tasks?state=queued"}, {"GET", "/console/tasks/" + id},
		{"GET", "/console/dead-letters"}, {"GET", "/console/bulk?action=discard"}, {"GET", "/console/spend"}, {"GET", "/console/reruns"},
		{"GET", "/console/assets/console.js"}, {"GET", "/console/assets/console.css"}, {"GET", "/console/no-such-page"},
		{"GET", console.LoginPath}, {"GET", console.LoginPath + "?token=forged"},
		{"POST", "/console/dead-letters/" + id + ":delivery:0:0"}, {"POST", "/console/bulk"}, {"POST", "/console/reruns"}, {"POST", "/console/logout"},
	}
	try := func(c *http.Client, name string) {
		for _, r := range routes {
			req, _ := http.NewRequest(r.method, base+r.path, strings.NewReader("action=discard&csrf=x"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), `name="csrf"`) {
				t.Errorf("%s: %s %s answered %d, want 401 and no page", name, r.method, r.path, resp.StatusCode)
			}
		}
	}
	try(browser(t), "no cookie")
	forged := browser(t)
	u, _ := url.Parse(base)
	forged.Jar.SetCookies(u, []*http.Cookie{{Name: "genbox_console", Value: "forged-session", Path: "/console"}})
	try(forged, "a forged cookie")

	c := browser(t)
	login(t, c, s.Info.Console)
	for _, r := range routes[:10] {
		want := http.StatusOK
		if r.path == "/console/tasks/"+id {
			want = http.StatusNotFound // a page of its own, in the session: no such task
		}
		if code, _ := get(t, c, base+r.path); code != want {
			t.Errorf("with a session: GET %s answered %d", r.path, code)
		}
	}
	if code, _ := get(t, browser(t), s.Info.Console); code != http.StatusUnauthorized {
		t.Errorf("the login link a second time: %d, want 401 (it works once)", code)
	}
}

// A decision without the session's CSRF token, or with another one, is refused and changes
// nothing; with it, it is recorded once, by the session's operator, and a repeat says so.
func TestDecisionsNeedTheCSRFToken(t *testing.T) {
	t.Parallel()
	s := devstack.StartTest(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, dl := deadDelivery(t, ctx, s)
	c := browser(t)
	csrf := login(t, c, s.Info.Console)
	decide := s.Info.DLQ + "/console/dead-letters/" + dl
	for name, form := range map[string]url.Values{
		"missing": {"action": {"discard"}},
		"forged":  {"action": {"discard"}, "csrf": {csrf[:len(csrf)-2] + "xx"}},
		"empty":   {"action": {"discard"}, "csrf": {""}},
	} {
		if code, _ := post(t, c, decide, form); code != http.StatusForbidden {
			t.Errorf("%s CSRF token: %d, want 403", name, code)
		}
	}
	// Another session's token is not this session's.
	other := browser(t)
	loginURL := s.Info.DLQ + issue(t, s)
	otherCSRF := login(t, other, loginURL)
	if code, _ := post(t, c, decide, url.Values{"action": {"discard"}, "csrf": {otherCSRF}}); code != http.StatusForbidden {
		t.Errorf("another session's CSRF token: %d, want 403", code)
	}
	if d, err := s.Store.GetDeadLetter(ctx, dl); err != nil || d.State != store.DeadLetterOpen {
		t.Fatalf("after refused decisions: %+v %v, want it open", d, err)
	}
	for i := range 2 {
		code, h := post(t, c, decide, url.Values{"action": {"discard"}, "csrf": {csrf}})
		if code != http.StatusSeeOther {
			t.Fatalf("decision %d: %d", i, code)
		}
		done, _ := url.ParseQuery(strings.SplitN(h.Get("Location"), "?", 2)[1])
		want := "discard recorded"
		if i == 1 {
			want = "already decided by " + devDecider(s)
		}
		if !strings.Contains(done.Get("done"), want) {
			t.Errorf("decision %d answered %q, want it to say %q", i, done.Get("done"), want)
		}
	}
	d, err := s.Store.GetDeadLetter(ctx, dl)
	if err != nil || d.State != store.DeadLetterDiscarded || d.DecidedBy != devDecider(s) {
		t.Fatalf("dead letter %+v %v, want discarded by %s", d, err, devDecider(s))
	}
}

// devDecider is who the stack's console link decides as: its admin key, saying "dev".
func devDecider(s *devstack.Stack) string {
	return httpapi.NewAdminKey(s.Info.AdminKey).Says(devstack.DevOperator)
}

// issue asks for a one-time login link with the admin key, as an operator on Cloud Run does.
func issue(t *testing.T, s *devstack.Stack) string {
	t.Helper()
	req, _ := http.NewRequest("POST", s.Info.DLQ+console.LoginTokenPath, strings.NewReader(`{"operator":"alice"}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("login token without the admin key: %v %v, want 401", resp, err)
	}
	req, _ = http.NewRequest("POST", s.Info.DLQ+console.LoginTokenPath, strings.NewReader(`{"operator":"alice"}`))
	req.Header.Set("Authorization", "Bearer "+s.Info.AdminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out console.LoginTokenResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("login token: %d %v", resp.StatusCode, err)
	}
	u, err := url.Parse(out.URL)
	if err != nil || u.Path != console.LoginPath {
		t.Fatalf("login URL %q", out.URL)
	}
	return u.RequestURI()
}
