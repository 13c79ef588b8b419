package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/genbox-dev/genbox/pkg/task"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxEventBytes bounds one event of a stream (a preview carries the text so far).
const maxEventBytes = 4 << 20

// errStreamEnded means the server closed a stream before its final event: reconnect.
var errStreamEnded = errors.New("genbox: event stream ended before the task did")

// Watch follows task id through GET /v1/tasks/{id}/events and calls fn with each event, in order:
// the task's state at once, then every change, and a streamed task's previews. It returns nil
// after the final event (the task has finished and its delivery is settled), fn's error when fn
// fails, or the error that ended it. A dropped stream is resumed with Last-Event-ID, so no change
// is shown twice; connection failures, 429 and 5xx answers are retried with the client's backoff
// (Retry-After honoured), up to its retry count in a row without an event. Any other answer is
// returned as its *task.Problem (404: no such task, or a server without the route).
func (c *Client) Watch(ctx context.Context, id string, fn func(task.StreamEvent) error) error {
	last := ""
	for failures := 0; ; {
		got, err := c.watchOnce(ctx, id, &last, fn)
		var done *watchDone
		switch {
		case errors.As(err, &done):
			return done.err
		case ctx.Err() != nil:
			return ctx.Err()
		case !retryable(err) && !errors.Is(err, errStreamEnded):
			return err
		}
		if got {
			failures = 0
		}
		if failures >= c.retries {
			return err
		}
		delay := c.retryDelay.Delay(failures+1, nil)
		var p *task.Problem
		if errors.As(err, &p) && p.RetryAfter > 0 {
			delay = p.RetryAfter
		}
		failures++
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// watchDone ends Watch: the final event was handled, or fn failed (err).
type watchDone struct{ err error }

func (w *watchDone) Error() string {
	if w.err == nil {
		return "done"
	}
	return w.err.Error()
}

// watchOnce reads one connection of the stream, after *last, updating it. got reports whether
// any event came.
func (c *Client) watchOnce(ctx context.Context, id string, last *string, fn func(task.StreamEvent) error) (got bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/tasks/"+url.PathEscape(id)+"/events", nil)
	if err != nil {
		return false, &watchDone{fmt.Errorf("genbox: %w", err)}
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if *last != "" {
		req.Header.Set("Last-Event-ID", *last)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return false, &errTransport{err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, problemOf(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventBytes)
	var id0, typ string
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data.Len() == 0 {
				typ, id0 = "", ""
				continue
			}
			var ev task.StreamEvent
			if err := json.Unmarshal([]byte(data.String()), &ev); err != nil {
				return got, &watchDone{fmt.Errorf("genbox: decode %s event: %w", typ, err)}
			}
			if typ != "" {
				ev.Type = task.EventType(typ)
			}
			ev.ID = id0
			if id0 != "" {
				*last = id0
			}
			got = true
			if err := fn(ev); err != nil {
				return got, &watchDone{err}
			}
			if ev.Final() {
				return got, &watchDone{}
			}
			typ, id0 = "", ""
			data.Reset()
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "": // a comment: a heartbeat
		case "id":
			id0 = value
		case "event":
			typ = value
		case "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(value)
		}
	}
	if err := sc.Err(); err != nil {
		return got, &errTransport{err}
	}
	return got, errStreamEnded
}

// problemOf reads a non-2xx answer as its *Problem.
func problemOf(resp *http.Response) *task.Problem {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return problemFrom(resp, data)
}
