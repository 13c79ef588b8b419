package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// sseAnswer writes events as an event stream, then ends the answer (a dropped connection).
func sseAnswer(events ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "retry: 10\n\n: heartbeat\n\n")
		for _, e := range events {
			fmt.Fprint(w, e)
		}
	}
}

func ev(id, typ, state, delivery string) string {
	data := fmt.Sprintf(`{"type":%q,"timestamp":"2026-12-01T10:00:00Z","attempts":0,"task":{"task_id":"t1","state":%q,"delivery":{"state":%q,"attempts":0}}}`, typ, state, delivery)
	if id == "" {
		return "event: " + typ + "\ndata: " + data + "\n\n"
	}
	return "id: " + id + "\nevent: " + typ + "\ndata: " + data + "\n\n"
}

// Watch reconnects a dropped stream with the Last-Event-ID it last received, hands over every
// event once, in order, and returns nil after the final one.
func TestWatchResumesWithLastEventID(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter, *http.Request){
		sseAnswer(ev("1", "task.queued", "queued", "none"), ev("2", "task.running", "running", "none")),
		func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) },
		sseAnswer("event: task.preview\ndata: {\"type\":\"task.preview\",\"preview\":\"The sum\"}\n\n", ev("3", "task.succeeded", "succeeded", "pending")),
		sseAnswer(ev("4", "task.delivery", "succeeded", "delivered")),
	}}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	c := client.New(hs.URL, "key", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	var got []string
	err := c.Watch(context.Background(), "t1", func(e task.StreamEvent) error {
		got = append(got, e.ID+" "+string(e.Type)+" "+e.Preview)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"1 task.queued ", "2 task.running ", " task.preview The sum", "3 task.succeeded ", "4 task.delivery "}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
	var last []string
	for _, r := range s.reqs {
		if r.URL.Path != "/v1/tasks/t1/events" || r.Header.Get("Authorization") != "Bearer key" {
			t.Errorf("request %s with %q", r.URL.Path, r.Header.Get("Authorization"))
		}
		last = append(last, r.Header.Get("Last-Event-ID"))
	}
	if d := cmp.Diff([]string{"", "2", "2", "3"}, last); d != "" {
		t.Errorf("Last-Event-ID per connection (-want +got):\n%s", d)
	}
}

// Watch returns a 4xx answer as its Problem at once, fn's error as is, and gives up after its
// retries of connections that bring nothing.
func TestWatchErrors(t *testing.T) {
	t.Parallel()
	notFound := &script{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", task.ProblemContentType)
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"type":"x","title":"Not Found","status":404,"detail":"no such resource"}`)
	}}}
	hs := httptest.NewServer(notFound)
	t.Cleanup(hs.Close)
	var p *task.Problem
	if err := client.New(hs.URL, "k").Watch(context.Background(), "t1", func(task.StreamEvent) error { return nil }); !errors.As(err, &p) || p.Status != 404 || len(notFound.reqs) != 1 {
		t.Errorf("404: %v after %d requests, want the problem after one", err, len(notFound.reqs))
	}

	stop := errors.New("enough")
	live := &script{steps: []func(http.ResponseWriter, *http.Request){sseAnswer(ev("1", "task.queued", "queued", "none"))}}
	hl := httptest.NewServer(live)
	t.Cleanup(hl.Close)
	if err := client.New(hl.URL, "k").Watch(context.Background(), "t1", func(task.StreamEvent) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("fn's error: %v, want it returned", err)
	}

	empty := &script{steps: []func(http.ResponseWriter, *http.Request){sseAnswer()}}
	he := httptest.NewServer(empty)
	t.Cleanup(he.Close)
	err := client.New(he.URL, "k", client.WithRetries(2), client.WithBackoff(time.Millisecond, time.Millisecond)).
		Watch(context.Background(), "t1", func(task.StreamEvent) error { return nil })
	if err == nil || len(empty.reqs) != 3 {
		t.Errorf("streams that bring nothing: %v after %d connections, want an error after 3", err, len(empty.reqs))
	}
}
