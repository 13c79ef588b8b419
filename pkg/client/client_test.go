package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// script answers the i-th request with steps[i] (the last step repeats) and records requests.
type script struct {
	mu    sync.Mutex
	steps []func(w http.ResponseWriter, r *http.Request)
	reqs  []*http.Request
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	i := min(len(s.reqs), len(s.steps)-1)
	s.reqs = append(s.reqs, r)
	step := s.steps[i]
	s.mu.Unlock()
	step(w, r)
}

func (s *script) requests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.reqs...)
}

func status(code int, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", task.ProblemContentType)
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"type":"https://genbox.dev/problems/x","title":"%s","status":%d,"errors":[{"field":"input","detail":"is required"}]}`, http.StatusText(code), code)
	}
}

func accepted(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprint(w, `{"task_id":"t1","state":"queued","status_url":"http://x/v1/tasks/t1"}`)
}

func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func newClient(t *testing.T, s *script) *client.Client {
	t.Helper()
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return client.New(hs.URL, "gbx_key", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
}

func TestSubmitRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter, *http.Request){hangUp, status(503), status(429, "Retry-After", "0"), accepted}}
	c := newClient(t, s)
	r, err := c.Submit(context.Background(), task.Request{Family: "summarize", Input: "x"})
	if err != nil || r.TaskID != "t1" || r.Replayed {
		t.Fatalf("submit: %+v %v", r, err)
	}
	reqs := s.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d requests, want 4", len(reqs))
	}
	key := reqs[0].Header.Get(task.HeaderIdempotencyKey)
	for i, r := range reqs {
		if got := r.Header.Get(task.HeaderIdempotencyKey); key == "" || got != key {
			t.Fatalf("request %d key %q, first %q", i, got, key)
		}
		if r.Header.Get("Authorization") != "Bearer gbx_key" || r.Method != "POST" || r.URL.Path != "/v1/tasks" {
			t.Fatalf("request %d: %s %s %v", i, r.Method, r.URL, r.Header)
		}
	}
	// The next call is another intent: another key.
	if _, err := c.Submit(context.Background(), task.Request{Family: "summarize", Input: "x"}); err != nil {
		t.Fatal(err)
	}
	if got := s.requests()[4].Header.Get(task.HeaderIdempotencyKey); got == key {
		t.Fatal("a second Submit reused the first key")
	}
}

func TestProblemsAreNotRetried(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter, *http.Request){status(400)}}
	c := newClient(t, s)
	_, err := c.Submit(context.Background(), task.Request{})
	var p *task.Problem
	if !errors.As(err, &p) || p.Status != 400 || len(p.Errors) != 1 || p.Errors[0].Field != "input" {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(err.Error(), "input: is required") {
		t.Fatalf("message %q", err)
	}
	if n := len(s.requests()); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

func TestRetryAfterIsHonored(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter, *http.Request){status(429, "Retry-After", "30"), accepted}}
	c := newClient(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // a retry ignoring Retry-After would come within ms
	defer cancel()
	_, err := c.Submit(ctx, task.Request{Family: "summarize", Input: "x"})
	var p *task.Problem
	if !errors.As(err, &p) || p.Status != 429 || p.RetryAfter != 30*time.Second || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
	if n := len(s.requests()); n != 1 {
		t.Fatalf("%d requests: the client did not wait for Retry-After", n)
	}
}

func TestRetriesAreBounded(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter, *http.Request){status(503)}}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	c := client.New(hs.URL, "k", client.WithRetries(2), client.WithBackoff(time.Millisecond, time.Millisecond))
	if _, err := c.Get(context.Background(), "t1"); err == nil {
		t.Fatal("no error")
	}
	if n := len(s.requests()); n != 3 {
		t.Fatalf("%d requests, want 1 + 2 retries", n)
	}
}

func TestWaitAndAll(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	gets := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gets++
		state := task.StateRunning
		if gets >= 3 {
			state = task.StateSucceeded
		}
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(task.View{TaskID: r.PathValue("id"), State: state})
	})
	mux.HandleFunc("GET /v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		pages := map[string]task.List{
			"":   {Tasks: []task.View{{TaskID: "a"}, {TaskID: "b"}}, NextPageToken: "p2"},
			"p2": {Tasks: []task.View{{TaskID: "c"}}},
		}
		if r.URL.Query().Get("state") != "queued" || r.URL.Query().Get("limit") != "2" {
			http.Error(w, "bad query", 400)
			return
		}
		_ = json.NewEncoder(w).Encode(pages[r.URL.Query().Get("page_token")])
	})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	c := client.New(hs.URL, "k")
	v, err := c.Wait(context.Background(), "t9", time.Millisecond)
	if err != nil || v.State != task.StateSucceeded || v.TaskID != "t9" {
		t.Fatalf("wait: %+v %v", v, err)
	}
	var ids []string
	for v, err := range c.All(context.Background(), client.ListOptions{State: task.StateQueued, Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.TaskID)
	}
	if strings.Join(ids, ",") != "a,b,c" {
		t.Fatalf("all: %v", ids)
	}
}

func TestNonProblemErrorBody(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream broke", http.StatusBadGateway)
	}))
	t.Cleanup(hs.Close)
	_, err := client.New(hs.URL, "k", client.WithRetries(0)).Get(context.Background(), "t1")
	var p *task.Problem
	if !errors.As(err, &p) || p.Status != 502 || !strings.Contains(p.Detail, "upstream broke") {
		t.Fatalf("err %v", err)
	}
}

// A re-run id the client makes up is typed back on command lines (genbox rerun status ID): none
// may read as a flag. One in 64 random ids would start with '-' without the prefix.
func TestRerunIDsNeverReadAsFlags(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var ids []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req task.RerunRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Error(err)
		}
		mu.Lock()
		ids = append(ids, req.RerunID)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"rerun_id":%q}`, req.RerunID)
	}))
	t.Cleanup(hs.Close)
	c := client.New(hs.URL, "gbx_key")
	for range 500 {
		if _, err := c.Rerun(context.Background(), task.RerunRequest{Filter: task.RerunFilter{Family: "summarize"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if id == "" || strings.HasPrefix(id, "-") {
			t.Fatalf("re-run id %q", id)
		}
	}
}
