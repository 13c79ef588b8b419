package publisher

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// eventsTimeout bounds the wait for one event: generous, the listener answers in milliseconds.
const eventsTimeout = 20 * time.Second

// move changes a task as a worker or the resulthandler would.
func (e *env) move(id string, change func(t *protocol.Task, now time.Time)) {
	e.t.Helper()
	if _, err := e.st.MutateTask(context.Background(), id, func(t *protocol.Task, now time.Time) error {
		change(t, now)
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
}

// watcher runs Watch in the background and hands over each event.
type watcher struct {
	events chan task.StreamEvent
	done   chan error
}

func (e *env) watch(ctx context.Context, c *client.Client, id string) *watcher {
	w := &watcher{events: make(chan task.StreamEvent, 64), done: make(chan error, 1)}
	go func() {
		w.done <- c.Watch(ctx, id, func(ev task.StreamEvent) error {
			w.events <- ev
			return nil
		})
	}()
	return w
}

func (w *watcher) next(t *testing.T) task.StreamEvent {
	t.Helper()
	select {
	case ev := <-w.events:
		return ev
	case err := <-w.done:
		w.done <- err // for a later wait on done
		select {      // an event the stream sent before it ended is still delivered first
		case ev := <-w.events:
			return ev
		default:
		}
		t.Fatalf("Watch ended (%v) while an event was awaited", err)
	case <-time.After(eventsTimeout):
		t.Fatal("no event")
	}
	return task.StreamEvent{}
}

// The stream sends the current state, then each change in order, named as webhooks name the
// end states, and ends once the task has finished and its delivery is settled.
func TestEventsFollowATaskToItsEnd(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.submit(validRequest()).TaskID
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := e.watch(ctx, e.api, id)

	type seen struct {
		Type     task.EventType
		State    task.State
		Attempts int
		Delivery task.DeliveryState
	}
	var got []seen
	step := func(change func(t *protocol.Task, now time.Time)) {
		if change != nil {
			e.move(id, change)
		}
		ev := w.next(t)
		if ev.ID == "" || ev.Task == nil || ev.Task.TaskID != id {
			t.Fatalf("event %+v: want an id and the task", ev)
		}
		got = append(got, seen{ev.Type, ev.Task.State, ev.Attempts, ev.Task.Delivery.State})
	}
	step(nil)
	step(func(t *protocol.Task, now time.Time) {
		t.State = task.StateRunning
		_ = t.Lease.Take("w1", now, time.Minute)
	})
	// A lease renewal shows nothing: the next event is the failed attempt.
	e.move(id, func(t *protocol.Task, now time.Time) { _ = t.Lease.Renew("w1", t.Lease.Epoch, now, time.Minute) })
	step(func(t *protocol.Task, now time.Time) {
		t.State, t.Attempts = task.StateQueued, 1
		_ = t.Lease.Release("w1", t.Lease.Epoch)
	})
	step(func(t *protocol.Task, now time.Time) {
		t.State = task.StateRunning
		_ = t.Lease.Take("w2", now, time.Minute)
	})
	step(func(t *protocol.Task, now time.Time) {
		past := now.Add(-time.Second)
		t.Lease.ExpiresAt = &past
		t.Claims++
		_ = t.Lease.Take("w3", now, time.Minute)
	})
	step(func(t *protocol.Task, now time.Time) {
		t.Output, t.OutputAt, t.OutputEpoch, t.Model = "the output", &now, t.Lease.Epoch, "gemini-test"
		t.CallbackURL = "https://example.invalid/hook"
		t.Finish(task.StateSucceeded, now)
	})
	step(func(t *protocol.Task, now time.Time) {
		t.Delivery.State, t.Delivery.Attempts, t.Delivery.DeliveredAt = task.DeliveryDelivered, 1, &now
	})
	want := []seen{
		{"task.queued", task.StateQueued, 0, task.DeliveryNone},
		{"task.running", task.StateRunning, 0, task.DeliveryNone},
		{"task.queued", task.StateQueued, 1, task.DeliveryNone},
		{"task.running", task.StateRunning, 1, task.DeliveryNone},
		{"task.attempt", task.StateRunning, 1, task.DeliveryNone},
		{"task.succeeded", task.StateSucceeded, 1, task.DeliveryPending},
		{"task.delivery", task.StateSucceeded, 1, task.DeliveryDelivered},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
	select {
	case err := <-w.done:
		if err != nil {
			t.Errorf("Watch after the final event: %v, want nil", err)
		}
	case <-time.After(eventsTimeout):
		t.Error("Watch did not end after the final event")
	}
}

// rawStream opens the event stream with hdr and returns the answer.
func (e *env) rawStream(ctx context.Context, url, id, key string, hdr map[string]string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/tasks/"+id+"/events", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// sseEvent is one event as read off the wire.
type sseEvent struct{ id, typ, data string }

// readEvents reads events (and comment lines, as typ ":") until n are read or the stream ends.
func readEvents(t *testing.T, resp *http.Response, n int, comments bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var cur sseEvent
	for len(out) < n && sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.typ != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			if comments {
				out = append(out, sseEvent{typ: ":", data: line})
			}
		case strings.HasPrefix(line, "id: "):
			cur.id = line[len("id: "):]
		case strings.HasPrefix(line, "event: "):
			cur.typ = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[len("data: "):]
		}
	}
	return out
}

// waitStreamsEnded waits until e's tenant has no event stream open.
func waitStreamsEnded(t *testing.T, e *env) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		e.srv.streams.mu.Lock()
		open := e.srv.streams.open[e.tenant]
		e.srv.streams.mu.Unlock()
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d event streams of the tenant still open", open)
		}
	}
}

// Last-Event-ID resumes after what the client saw: the state it saw is not sent again, a later
// one is; a finished task seen to its end closes the stream at once.
func TestEventsResumeAfterLastEventID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.submit(validRequest()).TaskID
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first := readEvents(t, e.rawStream(ctx, e.url, id, e.key, nil), 1, false)
	if len(first) != 1 || first[0].typ != "task.queued" || first[0].id == "" {
		t.Fatalf("first connection: %+v, want one task.queued event with an id", first)
	}
	// Reconnecting after the current state: nothing until the next change, then that change.
	resp := e.rawStream(ctx, e.url, id, e.key, map[string]string{"Last-Event-ID": first[0].id})
	e.move(id, func(t *protocol.Task, now time.Time) {
		t.State = task.StateRunning
		_ = t.Lease.Take("w1", now, time.Minute)
	})
	got := readEvents(t, resp, 1, false)
	if len(got) != 1 || got[0].typ != "task.running" {
		t.Fatalf("resumed: %+v, want task.running first (the queued state was already seen)", got)
	}
	running := got[0].id
	// A change the client missed while away is sent at once on resume (as its latest state).
	e.move(id, func(t *protocol.Task, now time.Time) {
		t.Output, t.OutputAt, t.OutputEpoch = "out", &now, t.Lease.Epoch
		t.Finish(task.StateSucceeded, now)
	})
	got = readEvents(t, e.rawStream(ctx, e.url, id, e.key, map[string]string{"Last-Event-ID": running}), 5, false)
	if len(got) != 1 || got[0].typ != "task.succeeded" {
		t.Fatalf("resumed after running: %+v, want task.succeeded then the end", got)
	}
	// Resumed after the final event: 204, nothing to send (see TestEventsEndedStreamTellsEventSourceToStop).
	if resp := e.rawStream(ctx, e.url, id, e.key, map[string]string{"Last-Event-ID": got[0].id}); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("resumed after the end: %d, want 204", resp.StatusCode)
	}
	bad := e.rawStream(ctx, e.url, id, e.key, map[string]string{"Last-Event-ID": "yesterday"})
	if bad.StatusCode != http.StatusBadRequest {
		t.Errorf("Last-Event-ID yesterday: %d, want 400", bad.StatusCode)
	}
}

// A browser's EventSource reconnects whenever a stream closes, unless the answer is a 204 (the
// HTML standard's "fail the connection"). So a finished task's stream sends its final state once
// and closes; the reconnect that follows, with that event's id as Last-Event-ID, is a 204 — before
// the stream bound, without a listener — and a reconnect from before the end still gets the end.
func TestEventsEndedStreamTellsEventSourceToStop(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config, _ *Deps) { c.EventsPerTenant = 1 })
	id := e.submit(validRequest()).TaskID
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	queued := readEvents(t, e.rawStream(ctx, e.url, id, e.key, nil), 1, false)
	if len(queued) != 1 {
		t.Fatalf("first connection: %+v, want the queued state", queued)
	}
	e.finish(id, task.StateSucceeded)
	waitStreamsEnded(t, e) // the final state ends the open stream, which frees the tenant's one

	first := e.rawStream(ctx, e.url, id, e.key, nil)
	final := readEvents(t, first, 5, false)
	if first.StatusCode != http.StatusOK || len(final) != 1 || final[0].typ != string(task.EventSucceeded) {
		t.Fatalf("first connection to the finished task: %d %+v, want 200 with its final event only", first.StatusCode, final)
	}
	// The tenant's one stream is taken: a reconnect that needs none is still answered.
	other := e.rawStream(ctx, e.url, e.submit(validRequest()).TaskID, e.key, nil)
	if got := readEvents(t, other, 1, false); len(got) != 1 {
		t.Fatalf("the stream holding the bound: %+v", got)
	}
	for _, c := range []struct {
		name, last string
		want       int
	}{
		{"after the final event", final[0].id, http.StatusNoContent},
		{"after a later id", time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano), http.StatusNoContent},
		{"from before the end, past the bound", queued[0].id, http.StatusTooManyRequests},
	} {
		resp := e.rawStream(ctx, e.url, id, e.key, map[string]string{"Last-Event-ID": c.last})
		if resp.StatusCode != c.want {
			t.Errorf("reconnect %s: %d, want %d", c.name, resp.StatusCode, c.want)
		}
	}
}

// The route authenticates like every tenant route: no key is a 401, another tenant's task and
// an unknown one are 404s, before any stream begins.
func TestEventsAuth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.submit(validRequest()).TaskID
	_, otherKey := e.newTenant("other", nil)
	ctx := context.Background()
	for _, c := range []struct {
		name, id, key string
		want          int
	}{
		{"no key", id, "", http.StatusUnauthorized},
		{"unknown key", id, "gbx_nobody_0123456789", http.StatusUnauthorized},
		{"another tenant's task", id, otherKey, http.StatusNotFound},
		{"unknown task", strings.Repeat("0", 32), e.key, http.StatusNotFound},
		{"not a task id", "x", e.key, http.StatusNotFound},
	} {
		resp := e.rawStream(ctx, e.url, c.id, c.key, nil)
		if resp.StatusCode != c.want || resp.Header.Get("Content-Type") != task.ProblemContentType {
			t.Errorf("%s: %d %s, want %d problem+json", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), c.want)
		}
	}
	var p *task.Problem
	err := client.New(e.url, otherKey, client.WithRetries(0)).Watch(ctx, id, func(task.StreamEvent) error { return nil })
	if !errors.As(err, &p) || p.Status != http.StatusNotFound {
		t.Errorf("Watch of another tenant's task: %v, want a 404 problem", err)
	}
}

// A tenant may hold GENBOX_EVENTS_PER_TENANT streams per instance: the next is a 429 with
// Retry-After, another tenant is not affected, and a closed stream frees its place.
func TestEventsConnectionBound(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config, _ *Deps) { c.EventsPerTenant = 2 })
	id := e.submit(validRequest()).TaskID
	ctx := context.Background()
	var open []context.CancelFunc
	for range 2 {
		sctx, cancel := context.WithCancel(ctx)
		open = append(open, cancel)
		resp := e.rawStream(sctx, e.url, id, e.key, nil)
		if got := readEvents(t, resp, 1, false); len(got) != 1 {
			t.Fatalf("stream within the bound: %+v", got)
		}
	}
	over := e.rawStream(ctx, e.url, id, e.key, nil)
	if over.StatusCode != http.StatusTooManyRequests || over.Header.Get("Retry-After") == "" {
		t.Fatalf("third stream: %d (Retry-After %q), want 429 with Retry-After", over.StatusCode, over.Header.Get("Retry-After"))
	}
	otherTenant, otherKey := e.newTenant("other", &task.Limits{SubmitRate: 100, SubmitBurst: 100})
	_ = otherTenant
	otherID := e.submitAs(otherKey, validRequest())
	if resp := e.rawStream(ctx, e.url, otherID, otherKey, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("another tenant's stream: %d, want 200", resp.StatusCode)
	}
	open[0]()
	deadline := time.Now().Add(eventsTimeout)
	for {
		resp := e.rawStream(ctx, e.url, id, e.key, nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatalf("after a stream closed: still %d", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	open[1]()
}

// submitAs submits with another tenant's key.
func (e *env) submitAs(key string, req task.Request) string {
	e.t.Helper()
	r, err := client.New(e.url, key, client.WithRetries(0)).Submit(context.Background(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return r.TaskID
}

// An idle stream sends heartbeats, and outlives the server's WriteTimeout: every write extends
// its own deadline.
func TestEventsHeartbeatsOutliveWriteTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config, _ *Deps) { c.EventsHeartbeat = 100 * time.Millisecond })
	hs := httptest.NewUnstartedServer(e.srv)
	hs.Config.WriteTimeout = 300 * time.Millisecond
	hs.Start()
	t.Cleanup(hs.Close)
	id := e.submit(validRequest()).TaskID
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp := e.rawStream(ctx, hs.URL, id, e.key, nil)
	start := time.Now()
	got := readEvents(t, resp, 1+8, true) // the state, then eight heartbeats (0.8 s, past the timeout)
	if len(got) != 9 || got[0].typ != "task.queued" {
		t.Fatalf("got %+v, want the state then 8 heartbeats", got)
	}
	for _, ev := range got[1:] {
		if ev.typ != ":" {
			t.Fatalf("got %+v, want heartbeats after the state", got)
		}
	}
	if time.Since(start) < hs.Config.WriteTimeout {
		t.Fatalf("the stream lasted %s, not past the WriteTimeout", time.Since(start))
	}
	// Still alive: a change goes through.
	e.move(id, func(t *protocol.Task, now time.Time) {
		t.State = task.StateRunning
		_ = t.Lease.Take("w1", now, time.Minute)
	})
	for {
		evs := readEvents(t, resp, 1, false)
		if len(evs) != 1 {
			t.Fatal("the stream ended after the WriteTimeout")
		}
		if evs[0].typ == "task.running" {
			break
		}
	}
}

// A streamed task's previews of its current call come as task.preview events without an id; a
// preview of an earlier claim is not shown, nor one after the output is stored.
func TestEventsPreviews(t *testing.T) {
	t.Parallel()
	e := setup(t)
	req := validRequest()
	req.Stream = true
	id := e.submit(req).TaskID
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	save := func(epoch int64, text string) {
		if err := e.st.SavePreview(ctx, id, store.Preview{Epoch: epoch, Text: text}); err != nil {
			t.Fatal(err)
		}
	}
	save(0, "a stale preview of an earlier claim")
	w := e.watch(ctx, e.api, id)
	if ev := w.next(t); ev.Type != "task.queued" {
		t.Fatalf("first event %+v", ev)
	}
	e.move(id, func(t *protocol.Task, now time.Time) {
		t.State = task.StateRunning
		_ = t.Lease.Take("w1", now, time.Minute)
	})
	if ev := w.next(t); ev.Type != "task.running" {
		t.Fatalf("second event %+v", ev)
	}
	save(1, "The sum")
	ev := w.next(t)
	if ev.Type != task.EventPreview || ev.Preview != "The sum" || ev.ID != "" || ev.Task != nil {
		t.Fatalf("preview event %+v, want task.preview \"The sum\" without an id or task", ev)
	}
	e.move(id, func(t *protocol.Task, now time.Time) {
		t.Output, t.OutputAt, t.OutputEpoch = "The summary.", &now, 1
		t.Finish(task.StateSucceeded, now)
	})
	ev = w.next(t)
	if ev.Type != "task.succeeded" || ev.Task.Output == nil || *ev.Task.Output != "The summary." {
		t.Fatalf("final event %+v", ev)
	}
	if err := <-w.done; err != nil {
		t.Fatal(err)
	}
}

// At shutdown (CloseStreams' context ends) open streams end, so the server can drain.
func TestEventsEndAtShutdown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.submit(validRequest()).TaskID
	sctx, stop := context.WithCancel(context.Background())
	closed := make(chan struct{})
	go func() { e.srv.CloseStreams(sctx); close(closed) }()
	resp := e.rawStream(context.Background(), e.url, id, e.key, nil)
	if got := readEvents(t, resp, 1, false); len(got) != 1 {
		t.Fatalf("before shutdown: %+v", got)
	}
	stop()
	<-closed
	ended := make(chan []sseEvent, 1)
	go func() { ended <- readEvents(t, resp, 1, false) }()
	select {
	case got := <-ended:
		if len(got) != 0 {
			t.Fatalf("after shutdown: %+v, want the end", got)
		}
	case <-time.After(eventsTimeout):
		t.Fatal("the stream did not end at shutdown")
	}
	if again := e.rawStream(context.Background(), e.url, id, e.key, nil); again.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a stream during shutdown: %d, want 503", again.StatusCode)
	}
}
