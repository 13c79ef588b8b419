package publisher

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

const testAdminKey = "admin-key-0123456789abcdef"

var _ Publisher = (*testenv.Publisher)(nil)

// testFamilies is the embedded prompt registry: summarize (default, digest), classify, analyze.
var testFamilies = func() *prompts.Registry {
	r, err := prompts.Default()
	if err != nil {
		panic(err)
	}
	return r
}()

// env is what an endpoint test needs: the server on the emulators, its store, the recorded
// nudges, an admin client and one tenant with a key.
type env struct {
	t      testing.TB
	cfg    Config
	st     *store.Store
	pub    *testenv.Publisher
	srv    *Server
	url    string
	admin  *client.Client
	tenant string
	key    string
	api    *client.Client
}

type option func(*Config, *Deps)

func setup(t testing.TB, opts ...option) *env {
	t.Helper()
	project := emulator.ProjectID(t)
	st := store.New(testenv.Firestore(t, project))
	st.MaxAttempts = 50
	st.Secrets = testenv.Secrets()
	cfg := DefaultConfig()
	cfg.ProjectID, cfg.AdminKey, cfg.SecretsKey = project, testAdminKey, testenv.SecretsKey
	pub := &testenv.Publisher{}
	d := Deps{Store: st, Publisher: pub, Families: testFamilies, Log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg, &d)
	}
	srv, err := New(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	watch(t, srv)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e := &env{t: t, cfg: cfg, st: d.Store, pub: pub, srv: srv, url: hs.URL,
		admin: client.New(hs.URL, testAdminKey, client.WithRetries(0))}
	if cfg.AdminKey != "" {
		e.tenant, e.key = e.newTenant("acme", &task.Limits{SubmitRate: 1000, SubmitBurst: 1000})
		e.api = client.New(hs.URL, e.key, client.WithRetries(0))
	}
	return e
}

// watch runs srv's key revocation listener until the test ends.
func watch(t testing.TB, srv *Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.WatchKeys(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// newTenant creates a tenant and an API key of it.
func (e *env) newTenant(id string, limits *task.Limits) (string, string) {
	e.t.Helper()
	ctx := context.Background()
	if _, err := e.admin.CreateTenant(ctx, id, limits); err != nil {
		e.t.Fatal(err)
	}
	k, err := e.admin.CreateAPIKey(ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return id, k.Key
}

// do sends a raw request and returns the status, headers and body.
func (e *env) do(method, path, key string, body []byte, hdr map[string]string) (int, http.Header, []byte) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// problemOf decodes a problem+json answer.
func problemOf(t testing.TB, h http.Header, body []byte) task.Problem {
	t.Helper()
	if ct := h.Get("Content-Type"); ct != task.ProblemContentType {
		t.Fatalf("content type %q, want %s; body %s", ct, task.ProblemContentType, body)
	}
	var p task.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("decode problem %s: %v", body, err)
	}
	return p
}

// fields lists the fields a problem names.
func fields(p task.Problem) []string {
	var out []string
	for _, f := range p.Errors {
		out = append(out, f.Field)
	}
	return out
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func validRequest() task.Request {
	return task.Request{Family: "summarize", Input: "text to work on", Labels: map[string]string{"app": "x"}}
}

// submit posts a request with the tenant's key and returns the accepted answer.
func (e *env) submit(req task.Request) *task.SubmitResponse {
	e.t.Helper()
	r, err := e.api.Submit(context.Background(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// finish moves a task into an end state with an output, as the worker would.
func (e *env) finish(id string, state task.State) *protocol.Task {
	e.t.Helper()
	t, err := e.st.MutateTask(context.Background(), id, func(t *protocol.Task, now time.Time) error {
		if state == task.StateSucceeded {
			t.Output, t.OutputAt, t.OutputEpoch = "the output", &now, 1
		}
		t.Usage = task.Usage{PromptTokens: 10, OutputTokens: 20, TotalTokens: 30}
		t.CostUSD, t.Model, t.Fingerprint = 0.001, "gemini-test", "fp-"+id
		t.Previous = []protocol.Generation{{Replay: 0, Output: "an older output", State: task.StateSucceeded}}
		t.Finish(state, now)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}
