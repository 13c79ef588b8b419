package publisher

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// eventWriteWindow is how long one write of an event stream may take. The stream extends its
// write deadline by this much before every write (http.ResponseController), so the route is
// never cut by the server's WriteTimeout, whatever it is, while a client that stops reading is
// still dropped.
const eventWriteWindow = 30 * time.Second

// eventRetryMS is the reconnection delay the stream asks EventSource clients for.
const eventRetryMS = 2000

// streams bounds the event streams open on this instance per tenant.
type streams struct {
	mu   sync.Mutex
	open map[string]int
	max  int
	// done ends every stream: the instance is shutting down (CloseStreams).
	done     chan struct{}
	doneOnce sync.Once
}

func newStreams(maxPerTenant int) *streams {
	return &streams{open: map[string]int{}, max: maxPerTenant, done: make(chan struct{})}
}

// acquire opens one stream of tenant, or reports false past the bound.
func (s *streams) acquire(tenant string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[tenant] >= s.max {
		return nil, false
	}
	s.open[tenant]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.open[tenant]--; s.open[tenant] == 0 {
			delete(s.open, tenant)
		}
	}, true
}

// CloseStreams ends every event stream when ctx ends: a background job, so that a shutdown
// drains the server without waiting for streams that would never end by themselves. Their
// clients reconnect elsewhere with Last-Event-ID.
func (s *Server) CloseStreams(ctx context.Context) {
	<-ctx.Done()
	s.streams.doneOnce.Do(func() { close(s.streams.done) })
}

// eventID is the SSE id of a task snapshot: the document's update time.
func eventID(t *protocol.Task) string { return t.UpdateTime.UTC().Format(time.RFC3339Nano) }

// visible is what an event stream shows of a task; a snapshot that changes none of it (a lease
// renewal, a sweeper's bookkeeping) sends nothing.
type visible struct {
	View     task.View
	Attempts int
	Epoch    int64
}

func visibleOf(t *protocol.Task) visible {
	return visible{View: t.View(), Attempts: t.Attempts, Epoch: t.Lease.Epoch}
}

// eventType names the change from prev (nil: the first event) to cur: the webhook event type
// of an end state, task.{state} for another state, else what changed.
func eventType(prev *visible, cur visible) task.EventType {
	s := cur.View.State
	switch {
	case prev == nil || prev.View.State != s:
		return s.StreamEvent()
	case prev.View.Delivery != cur.View.Delivery:
		return task.EventDelivery
	case prev.Attempts != cur.Attempts || prev.Epoch != cur.Epoch:
		return task.EventAttempt
	}
	return task.EventUpdated
}

// sse writes one stream's events, each within its write window.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e sse) write(format string, args ...any) error {
	// A writer that cannot set deadlines (a test recorder) has no WriteTimeout to escape either.
	_ = e.rc.SetWriteDeadline(time.Now().Add(eventWriteWindow))
	if _, err := fmt.Fprintf(e.w, format, args...); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (e sse) event(ev task.StreamEvent) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	if ev.ID == "" {
		return e.write("event: %s\ndata: %s\n\n", ev.Type, data)
	}
	return e.write("id: %s\nevent: %s\ndata: %s\n\n", ev.ID, ev.Type, data)
}

// handleEvents is GET /v1/tasks/{id}/events: a Firestore snapshot listener on the task, sent
// as Server-Sent Events — the current state at once, then each visible change — until the task
// has finished and its delivery is settled. After Last-Event-ID it skips what the client saw; a
// client that saw the final event gets a 204. A streamed task's previews come as task.preview
// events without an id.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, tenant string) error {
	t, err := s.ownTask(r, tenant)
	if err != nil {
		return err
	}
	var after time.Time
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		after, err = time.Parse(time.RFC3339Nano, last)
		if err != nil {
			return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "Last-Event-ID: not an id of this stream", task.FieldError{Field: "Last-Event-ID", Detail: "not an id of this stream"})
		}
	}
	if v := t.View(); (task.StreamEvent{Task: &v}).Final() && !t.UpdateTime.After(after) {
		// The client saw the final event: a 204 is what stops an EventSource from reconnecting
		// (the HTML standard's "fail the connection"), where a 200 that closes at once brings it
		// back every retry interval, forever.
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	release, ok := s.streams.acquire(tenant)
	if !ok {
		p := httpapi.Problem(http.StatusTooManyRequests, httpapi.TypeRateLimited,
			fmt.Sprintf("the tenant has %d event streams open on this instance, the most allowed (%s)", s.cfg.EventsPerTenant, EnvEventsPerTenant))
		p.RetryAfter = time.Duration(eventRetryMS) * time.Millisecond
		return p
	}
	defer release()
	ctx, cancel := context.WithCancel(obs.WithTask(r.Context(), t.ID))
	defer cancel()
	select {
	case <-s.streams.done:
		return httpapi.Problem(http.StatusServiceUnavailable, httpapi.TypeUnavailable, "the instance is shutting down; reconnect")
	default:
	}
	go func() {
		select {
		case <-s.streams.done:
			cancel()
		case <-ctx.Done():
		}
	}()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a proxy must not hold events back
	w.WriteHeader(http.StatusOK)
	out := sse{w: w, rc: http.NewResponseController(w)}
	if err := out.write("retry: %d\n\n", eventRetryMS); err != nil {
		return nil
	}
	err = s.stream(ctx, out, t, after)
	if err != nil && ctx.Err() == nil {
		s.log.WarnContext(ctx, "event stream ended", "task_id", t.ID, "error", err)
	}
	return nil // the answer has begun: an error can only end it
}

// watched is one snapshot of a listener.
type watched[T any] struct {
	v   T
	err error
}

// listen runs a listener into a channel until ctx ends.
func listen[T any](ctx context.Context, seq func(yield func(T, error) bool)) <-chan watched[T] {
	ch := make(chan watched[T])
	go func() {
		defer close(ch)
		for v, err := range seq {
			select {
			case ch <- watched[T]{v, err}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// stream sends t's events until it ends, ctx ends or a write fails.
func (s *Server) stream(ctx context.Context, out sse, t *protocol.Task, after time.Time) error {
	tasks := listen(ctx, s.st.WatchTask(ctx, t.ID))
	var previews <-chan watched[*store.Preview]
	if t.Stream {
		previews = listen(ctx, s.st.WatchPreview(ctx, t.ID))
	}
	beat := time.NewTicker(s.cfg.EventsHeartbeat)
	defer beat.Stop()
	var prev *visible
	var cur *protocol.Task
	// pending is the latest preview not shown yet: the two listeners are not in step, so a
	// preview of a claim may come before the task's snapshot of that claim.
	var pending *store.Preview
	shown := ""
	showPreview := func() error {
		p := pending
		// Only a preview of the task's current call: not of an earlier replay or claim, and
		// none once the call has ended.
		if p == nil || cur == nil || cur.State != task.StateRunning || p.Replay != cur.Replay || p.Epoch != cur.Lease.Epoch {
			return nil
		}
		pending = nil
		if p.Text == shown {
			return nil
		}
		shown = p.Text
		return out.event(task.StreamEvent{Type: task.EventPreview, Timestamp: p.UpdatedAt.UTC(), Attempts: cur.Attempts, Preview: p.Text})
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-beat.C:
			if err := out.write(": heartbeat\n\n"); err != nil {
				return err
			}
		case w, ok := <-tasks:
			if !ok {
				return nil
			}
			if w.err != nil {
				return w.err
			}
			cur = w.v
			v := visibleOf(cur)
			if prev != nil && reflect.DeepEqual(*prev, v) {
				continue
			}
			ev := task.StreamEvent{ID: eventID(cur), Type: eventType(prev, v), Timestamp: cur.UpdateTime.UTC(), Attempts: cur.Attempts, Task: &v.View}
			prev = &v
			if cur.UpdateTime.After(after) {
				if err := out.event(ev); err != nil {
					return err
				}
			}
			if ev.Final() {
				return nil
			}
			if err := showPreview(); err != nil {
				return err
			}
		case w, ok := <-previews:
			if !ok {
				previews = nil
				continue
			}
			if w.err != nil {
				s.log.WarnContext(ctx, "preview listener failed; the stream goes on without previews", "task_id", t.ID, "error", w.err)
				previews = nil
				continue
			}
			pending = w.v
			if err := showPreview(); err != nil {
				return err
			}
		}
	}
}
