// Package console is genbox's web console for operators: pages served by the dlqnotifier (which
// holds the decision code, the admin key and the Regenerate estimate) from assets embedded in the
// binary — plain HTML and one small script, no third-party requests. Every page needs a session:
// a one-time login link (printed by `genbox dev`, or issued by POST /console/login-token with the
// admin key) is exchanged for an HttpOnly, SameSite=Strict cookie, and every action carries the
// session's CSRF token. Decisions on dead letters go through dlqnotifier.Service.Decide, the
// same code as Slack's buttons, recorded as the admin routes record theirs: as the admin key that
// issued the session, with the name its holder gave beside it.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

//go:embed assets
var assets embed.FS

// Routes.
const (
	Prefix         = "/console/"
	LoginPath      = "/console/login"
	LoginTokenPath = "/console/login-token"
	cookieName     = "genbox_console"
)

// Decider applies a decision on a dead letter (*dlqnotifier.Service).
type Decider interface {
	Decide(ctx context.Context, id string, action dlqnotifier.Action, by string) (*store.DeadLetter, error)
}

// Estimator prices one more generation of a task (dlqnotifier.Estimator).
type Estimator interface {
	EstimateUSD(t *protocol.Task) (usd float64, ok bool)
}

var _ Decider = (*dlqnotifier.Service)(nil)

// Config is the console's settings.
type Config struct {
	// AdminKey authorizes POST /console/login-token and issues every login: a session lasts
	// only as long as the key that issued it; empty: no one logs in.
	AdminKey string
	// SessionTTL is how long a session lasts (12 h when zero).
	SessionTTL time.Duration
	// LoginTTL is how long a one-time login link is valid (10 min when zero).
	LoginTTL time.Duration
	// ProxyHops is the dlqnotifier's GENBOX_TRUSTED_PROXY_HOPS: how many addresses its
	// front ends append to X-Forwarded-For, to name the client of a failed credential.
	ProxyHops int
}

// Deps are the console's collaborators.
type Deps struct {
	Store     *store.Store
	Decider   Decider
	Estimator Estimator
	// Pricing prices the savings of the Spend page and re-runs' estimates.
	Pricing gemini.Pricing
	// Prompts renders tasks' prompts for a re-run: its new replays' prompt version, and the
	// estimate of a task no model answered (the dlqnotifier's families).
	Prompts rerun.Catalog
	Log     *slog.Logger
}

// Console serves the console's routes under Prefix.
type Console struct {
	cfg   Config
	d     Deps
	pages map[string]*template.Template
	mux   *http.ServeMux
	// admin checks login-token's Bearer admin key as the publisher and the dlqnotifier do, and
	// issues every session; authFails throttles clients whose keys, login links or session
	// cookies keep failing.
	admin     httpapi.AdminKey
	authFails *authlimit.Limiter
}

// New returns the console.
func New(cfg Config, d Deps) (*Console, error) {
	if d.Store == nil || d.Decider == nil || d.Estimator == nil || d.Prompts == nil {
		return nil, errors.New("console: Store, Decider, Estimator and Prompts are required")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.LoginTTL <= 0 {
		cfg.LoginTTL = 10 * time.Minute
	}
	throttle := authlimit.DefaultConfig()
	throttle.TrustedHops = cfg.ProxyHops
	c := &Console{cfg: cfg, d: d, pages: map[string]*template.Template{},
		admin: httpapi.NewAdminKey(cfg.AdminKey), authFails: authlimit.New(throttle, d.Store.Clock)}
	for _, p := range []string{"overview", "tasks", "task", "deadletters", "bulk", "spend", "schedules", "reruns", "message"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/parts.html", "assets/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("console: page %s: %w", p, err)
		}
		c.pages[p] = t
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	m := http.NewServeMux()
	m.HandleFunc("GET "+LoginPath, c.login)
	m.HandleFunc("POST "+LoginTokenPath, c.loginToken)
	m.Handle("GET /console/assets/", c.session(func(w http.ResponseWriter, r *http.Request, _ store.ConsoleSession) {
		http.StripPrefix("/console/assets/", http.FileServerFS(static)).ServeHTTP(w, r)
	}))
	m.Handle("GET /console/{$}", c.session(c.overview))
	m.Handle("GET /console/tasks", c.session(c.tasks))
	m.Handle("GET /console/tasks/{id}", c.session(c.task))
	m.Handle("GET /console/dead-letters", c.session(c.deadLetters))
	m.Handle("POST /console/dead-letters/{id}", c.session(c.action(c.decide)))
	m.Handle("GET /console/bulk", c.session(c.bulkPreview))
	m.Handle("POST /console/bulk", c.session(c.action(c.bulkDecide)))
	m.Handle("GET /console/spend", c.session(c.spend))
	m.Handle("GET /console/schedules", c.session(c.schedules))
	m.Handle("GET /console/reruns", c.session(c.reruns))
	m.Handle("POST /console/reruns", c.session(c.action(c.startRerun)))
	m.Handle("POST /console/logout", c.session(c.action(c.logout)))
	m.Handle("/console/", c.session(func(w http.ResponseWriter, r *http.Request, _ store.ConsoleSession) {
		c.message(w, http.StatusNotFound, "Not found", "The console has no page "+r.URL.Path+".")
	}))
	c.mux = m
	return c, nil
}

// ServeHTTP serves the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Nothing of the console may be framed, cached or load anything from elsewhere.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	c.mux.ServeHTTP(w, r)
}

// randomToken is 256 random bits, URL-safe.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// IssueLogin stores a one-time login for operator, issued by the admin key, and returns the
// path that redeems it (LoginPath?token=…), valid for LoginTTL. Its session's decisions are the
// admin key's; without an admin key no login is issued.
func (c *Console) IssueLogin(ctx context.Context, operator string) (string, error) {
	if !c.admin.Enabled() {
		return "", errors.New("console: no login without an admin key (" + httpapi.EnvAdminKey + ")")
	}
	tok := randomToken()
	if err := c.d.Store.CreateConsoleLogin(ctx, tok, c.admin.Operator(), operator, c.cfg.LoginTTL); err != nil {
		return "", err
	}
	return LoginPath + "?token=" + tok, nil
}

// LoginTokenRequest is the body of POST /console/login-token.
type LoginTokenRequest struct {
	Operator string `json:"operator"`
}

// LoginTokenResponse is its answer: the one-time login URL.
type LoginTokenResponse struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// loginToken is POST /console/login-token (Bearer GENBOX_ADMIN_KEY): a one-time login link for
// the operator named in the body — how an operator logs in on Cloud Run.
func (c *Console) loginToken(w http.ResponseWriter, r *http.Request) {
	if p := c.admin.Authorize(r, c.authFails); p != nil {
		if p.Status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="genbox-admin"`)
		}
		httpapi.Error(w, r, c.d.Log, p, nil)
		return
	}
	var body LoginTokenRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&body); err != nil || !validOperator(body.Operator) {
		httpapi.Error(w, r, c.d.Log, httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid,
			`body must be {"operator": "<who logs in>"} (1-64 printable characters)`), err)
		return
	}
	path, err := c.IssueLogin(r.Context(), strings.TrimSpace(body.Operator))
	if err != nil {
		httpapi.Error(w, r, c.d.Log, httpapi.Problem(http.StatusInternalServerError, httpapi.TypeInternal, "internal error"), err)
		return
	}
	httpapi.JSON(w, http.StatusOK, "application/json", LoginTokenResponse{URL: baseURL(r) + path, ExpiresAt: time.Now().Add(c.cfg.LoginTTL).UTC()})
}

func validOperator(s string) bool {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// baseURL is the scheme and host the request reached.
func baseURL(r *http.Request) string {
	if secure(r) {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

func secure(r *http.Request) bool {
	return r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"
}

// login redeems a one-time token for a session cookie and goes to the overview.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	tok := r.URL.Query().Get("token")
	if tok == "" {
		c.loggedOut(w)
		return
	}
	sid := randomToken()
	sess := store.ConsoleSession{Issuer: c.admin.Operator(), CSRF: randomToken(), ExpireAt: time.Now().Add(c.cfg.SessionTTL).UTC()}
	_, err := c.d.Store.RedeemConsoleLogin(r.Context(), tok, sid, sess)
	if errors.Is(err, store.ErrExpired) {
		if c.throttled(w, r) {
			return
		}
		c.message(w, http.StatusUnauthorized, "Login link used or expired", "A login link works once, for a few minutes. Ask for a new one (see docs/console.md).")
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: sid, Path: "/console", MaxAge: int(c.cfg.SessionTTL.Seconds()),
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// loggedOut answers a request without a session.
func (c *Console) loggedOut(w http.ResponseWriter) {
	c.message(w, http.StatusUnauthorized, "Log in to the genbox console",
		"Open the console link that `genbox dev` prints, or ask for a one-time link with the admin key: "+
			`curl -X POST -H "Authorization: Bearer $GENBOX_ADMIN_KEY" -d '{"operator":"you"}' $GENBOX_DLQ_URL/console/login-token`)
}

// throttled counts r's failed login link or session cookie as a failed credential and, once its
// client's failures or every client's are past their limits, answers 429 and reports true.
func (c *Console) throttled(w http.ResponseWriter, r *http.Request) bool {
	p := httpapi.Failed(c.authFails, r)
	if p == nil {
		return false
	}
	httpapi.SetRetryAfter(w.Header(), p.RetryAfter)
	c.message(w, p.Status, "Too many failed logins", "Too many login links or session cookies from this address failed lately. Wait a little, then try again.")
	return true
}

// endCookie tells the browser to forget its session cookie.
func endCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/console", MaxAge: -1, HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
}

// sessionHandler is a page that runs inside a session.
type sessionHandler func(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession)

// session admits only requests with a live session cookie.
func (c *Console) session(next sessionHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ck, err := r.Cookie(cookieName)
		if err != nil || ck.Value == "" {
			c.loggedOut(w)
			return
		}
		sess, err := c.d.Store.ConsoleSessionOf(r.Context(), ck.Value, c.admin.Operator())
		if errors.Is(err, store.ErrExpired) {
			if c.throttled(w, r) {
				return
			}
			endCookie(w, r) // the browser stops presenting it
			c.loggedOut(w)
			return
		}
		if err != nil {
			c.fail(w, r, err)
			return
		}
		next(w, r, sess)
	})
}

// action admits a POST only with the session's CSRF token in its form.
func (c *Console) action(next sessionHandler) sessionHandler {
	return func(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
		r.Body = http.MaxBytesReader(w, r.Body, 256<<10)
		got := r.PostFormValue("csrf")
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(sess.CSRF)) != 1 {
			c.message(w, http.StatusForbidden, "Refused", "The form's CSRF token is missing or wrong: reload the page and try again.")
			return
		}
		next(w, r, sess)
	}
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, _ store.ConsoleSession) {
	if ck, err := r.Cookie(cookieName); err == nil {
		if err := c.d.Store.DeleteConsoleSession(r.Context(), ck.Value); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	endCookie(w, r)
	c.message(w, http.StatusOK, "Logged out", "The session has ended.")
}

// page is what every page's template receives.
type page struct {
	Title    string
	Nav      string
	Operator string
	CSRF     string
	Live     bool
	Flash    string
	Data     any
}

// render writes a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, name string, p page) {
	var b strings.Builder
	if err := c.pages[name].Execute(&b, p); err != nil {
		c.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

// message writes a page of one message.
func (c *Console) message(w http.ResponseWriter, code int, title, text string) {
	var b strings.Builder
	if err := c.pages["message"].Execute(&b, page{Title: title, Data: text}); err != nil {
		http.Error(w, title, code)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

// fail answers an error the operator cannot fix.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	c.d.Log.ErrorContext(r.Context(), "console: request failed", "path", r.URL.Path, "error", err)
	c.message(w, http.StatusInternalServerError, "Something failed", "The console could not answer; try again. (It is logged.)")
}
