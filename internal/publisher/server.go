// Package publisher is genbox's REST API (docs/architecture.md §8): apps submit, read, list, cancel and erase
// tasks; admins manage tenants, API keys and webhook secrets. A submission is written to
// Firestore first (due now + a grace, so the sweeper nudges it if the publish is lost) and then
// nudged on gemini-tasks.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// Publisher publishes a nudge; *bus.Publisher implements it.
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

// Families resolves a family's variant: whether it exists, its prompt version, model chain and
// output bounds; and renders a task's prompt, to price a re-run. *prompts.Registry implements it.
type Families interface {
	Variant(family, variant string) (*prompts.Variant, error)
	rerun.Catalog
}

var _ Families = (*prompts.Registry)(nil)

// Deps are the publisher's collaborators.
type Deps struct {
	Store     *store.Store
	Publisher Publisher
	Families  Families
	// CheckCallback applies the callback URL policy; a non-nil error refuses the URL and says
	// why (an *ssrf.BlockedError for a well-formed URL the policy forbids is a 422). Nil:
	// ssrf.CheckURL with Config.AllowInsecureCallbacks and Config.CallbackPorts.
	CheckCallback func(rawURL string) error
	// NewSecret returns a new webhook signing secret. Nil: webhook.NewSecret.
	NewSecret func() (string, error)
	Log       *slog.Logger
	// Metrics counts submitted (queued) and cancelled tasks; nil records nothing.
	Metrics *obs.Metrics
	// Objects reads the files tasks name and signs uploads; nil: tasks take no files.
	Objects Objects
}

// Server is the publisher's HTTP handler.
type Server struct {
	cfg      Config
	st       *store.Store
	pub      Publisher
	families Families
	checkURL func(string) error
	newSec   func() (string, error)
	log      *slog.Logger
	metrics  *obs.Metrics
	objects  Objects
	limits   *limiters
	slots    *store.SlotHints
	keys     *keys
	// authFails throttles clients whose credentials keep failing.
	authFails *authlimit.Limiter
	streams   *streams
	reruns    rerun.Planner
	admin     httpapi.AdminKey
	routes    []route
	doc       func() []byte
	mux       *http.ServeMux
}

var _ http.Handler = (*Server)(nil)

// New returns the publisher's handler. cfg must be valid.
func New(cfg Config, d Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Store == nil || d.Publisher == nil || d.Families == nil {
		return nil, errors.New("publisher: Store, Publisher and Families are required")
	}
	if d.CheckCallback == nil {
		p := ssrf.URLPolicy{AllowInsecure: cfg.AllowInsecureCallbacks, Ports: cfg.CallbackPorts}
		d.CheckCallback = func(u string) error { return ssrf.CheckURL(u, p) }
	}
	if d.NewSecret == nil {
		d.NewSecret = webhook.NewSecret
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, st: d.Store, pub: d.Publisher, families: d.Families, checkURL: d.CheckCallback,
		newSec: d.NewSecret, log: d.Log, metrics: d.Metrics, objects: d.Objects, admin: httpapi.NewAdminKey(cfg.AdminKey)}
	s.limits = newLimiters(d.Store, cfg.LimitsTTL)
	s.slots = store.NewSlotHints(d.Store)
	s.keys = newKeys(d.Store, d.Log)
	throttle := authlimit.DefaultConfig()
	throttle.TrustedHops = cfg.ProxyHops
	s.authFails = authlimit.New(throttle, func() time.Time { return d.Store.Now() })
	s.streams = newStreams(cfg.EventsPerTenant)
	s.reruns = rerun.Planner{Store: d.Store, Estimator: rerun.Estimator{Pricing: cfg.Pricing, Prompts: d.Families}}
	s.routes = s.routeTable()
	s.doc = sync.OnceValue(s.openAPIJSON)
	s.mux = s.buildMux()
	return s, nil
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// WatchKeys runs the API key revocation listener until ctx ends. While it runs, a key already
// seen valid is not read again: its revocation arrives through the listener (the instance that
// revokes a key refuses it at once). Without it, every request reads its key's document.
func (s *Server) WatchKeys(ctx context.Context) { s.keys.watch(ctx) }

// auth says who may call a route.
type auth int

const (
	authNone   auth = iota
	authTenant      // Authorization: Bearer <api key>
	authAdmin       // Authorization: Bearer <GENBOX_ADMIN_KEY>
)

// route is one operation of the API; the OpenAPI document and the mux are both built from the
// route table, and a test checks the served document against what the mux answers.
type route struct {
	Method string
	// Path is the OpenAPI path; a final "{id}:action" segment is served by the {id} pattern.
	Path    string
	Summary string
	Auth    auth
	Handle  func(w http.ResponseWriter, r *http.Request, tenant string) error
	Doc     opDoc
}

// buildMux registers every route. Go's ServeMux cannot match "{id}:cancel" (a wildcard is a
// whole segment), so such routes share their "{id}" pattern and are told apart by the suffix.
func (s *Server) buildMux() *http.ServeMux {
	mux := http.NewServeMux()
	actions := map[string]map[string]route{} // mux pattern -> action -> route
	plain := map[string]route{}
	for _, rt := range s.routes {
		pattern, action := muxPattern(rt)
		if action == "" {
			plain[pattern] = rt
			continue
		}
		if actions[pattern] == nil {
			actions[pattern] = map[string]route{}
		}
		actions[pattern][action] = rt
	}
	for pattern, rt := range plain {
		if _, ok := actions[pattern]; ok {
			panic("publisher: " + pattern + " has both a plain route and actions")
		}
		mux.Handle(pattern, s.serve(rt))
	}
	for pattern, byAction := range actions {
		param := pattern[strings.LastIndex(pattern, "{")+1 : len(pattern)-1]
		handlers := map[string]http.Handler{}
		for a, rt := range byAction {
			handlers[a] = s.serve(rt)
		}
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			v := r.PathValue(param)
			i := strings.LastIndexByte(v, ':')
			h, ok := handlers[v[i+1:]]
			if i < 0 || !ok {
				s.writeError(w, r, httpapi.Problem(http.StatusNotFound, httpapi.TypeNoRoute, "no route "+r.Method+" "+r.URL.Path))
				return
			}
			r.SetPathValue(param, v[:i])
			h.ServeHTTP(w, r)
		})
	}
	mux.HandleFunc("/", s.noRoute)
	return mux
}

// muxPattern returns the ServeMux pattern of a route and its ":action" suffix, if any.
func muxPattern(rt route) (pattern, action string) {
	p := rt.Path
	if i := strings.LastIndex(p, "}:"); i >= 0 && !strings.Contains(p[i:], "/") {
		p, action = p[:i+1], p[i+2:]
	}
	return rt.Method + " " + p, action
}

// noRoute answers a path the API does not have (404) or a method it does not allow there (405).
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		r2 := r.Clone(r.Context())
		r2.Method = m
		if _, pat := s.mux.Handler(r2); pat != "/" && pat != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.writeError(w, r, httpapi.Problem(http.StatusMethodNotAllowed, httpapi.TypeMethod, r.Method+" is not allowed here"))
		return
	}
	s.writeError(w, r, httpapi.Problem(http.StatusNotFound, httpapi.TypeNoRoute, "no route "+r.Method+" "+r.URL.Path))
}

// serve wraps a route with authentication and the one error writer.
func (s *Server) serve(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := ""
		var err error
		switch rt.Auth {
		case authTenant:
			tenant, err = s.authenticate(r)
		case authAdmin:
			err = s.authorizeAdmin(r)
		}
		if err == nil {
			err = rt.Handle(w, r, tenant)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

// authenticate resolves the API key to its tenant.
func (s *Server) authenticate(r *http.Request) (string, error) {
	key, ok := httpapi.Bearer(r)
	if !ok {
		return "", httpapi.Problem(http.StatusUnauthorized, httpapi.TypeUnauth, "an Authorization: Bearer <api key> header is required")
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	tenant, err := s.keys.authenticate(ctx, key)
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrRevoked) {
		if p := httpapi.Failed(s.authFails, r); p != nil {
			return "", p
		}
		return "", httpapi.Problem(http.StatusUnauthorized, httpapi.TypeUnauth, "the API key is unknown or revoked")
	}
	if err != nil {
		return "", fmt.Errorf("authenticate: %w", err)
	}
	return tenant, nil
}

func (s *Server) authorizeAdmin(r *http.Request) error {
	if p := s.admin.Authorize(r, s.authFails); p != nil {
		return p
	}
	return nil
}

// pathIDs are the shapes of the path parameters: anything else names nothing (and must not
// reach Firestore, which refuses some document ids outright).
var pathIDs = map[string]*regexp.Regexp{
	"id":     regexp.MustCompile(`^[0-9a-f]{32}$`),
	"key_id": regexp.MustCompile(`^[0-9a-f]{64}$`),
	"tenant": regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`),
	"rerun":  rerunIDPattern,
}

// pathID returns the path parameter name, or ErrNotFound when it cannot name anything.
func pathID(r *http.Request, name string) (string, error) {
	v := r.PathValue(name)
	if !pathIDs[name].MatchString(v) {
		return "", fmt.Errorf("%s %q: %w", name, v, store.ErrNotFound)
	}
	return v, nil
}

// bound is ctx for one store call a request waits on, ended after Config.StoreTimeout: a stalled
// Firestore then fails the call with context.DeadlineExceeded, which httpapi.ProblemFor answers
// 503 with Retry-After, well before the server's WriteTimeout would cut the connection without
// an answer.
func (s *Server) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.StoreTimeout)
}

// now is the store's clock, so tests can move both together.
func (s *Server) now() time.Time { return s.st.Now().UTC() }
