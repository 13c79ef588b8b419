package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/pkg/task"
)

// errSeen stops a watch after its first event.
var errSeen = errors.New("seen")

// A delayed task is written scheduled, due at its start (not_before the same time), and not
// nudged: the sweeper nudges it when it is due. GET and the event stream show it scheduled with
// its start; it can be cancelled; an Idempotency-Key replays it.
func TestSubmitDelayed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	before := time.Now()
	start := time.Now().Add(time.Hour).Truncate(time.Second)
	cases := []struct {
		name string
		req  func(*task.Request)
		// lo and hi bound the start the task must record.
		lo, hi func() time.Time
	}{
		{"start_after", func(r *task.Request) { r.StartAfter = &start }, func() time.Time { return start }, func() time.Time { return start }},
		{"delay", func(r *task.Request) { r.Delay = "90s" },
			func() time.Time { return before.Add(90 * time.Second) }, func() time.Time { return time.Now().Add(90*time.Second + time.Microsecond) }},
	}
	for _, c := range cases {
		req := validRequest()
		c.req(&req)
		r, err := e.api.SubmitWithKey(ctx, "delayed-"+c.name, req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.State != task.StateScheduled {
			t.Fatalf("%s: answered %q, want scheduled", c.name, r.State)
		}
		doc, err := e.st.GetTask(ctx, r.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if doc.StartAfter == nil || doc.StartAfter.Before(c.lo()) || doc.StartAfter.After(c.hi()) {
			t.Fatalf("%s: start_after %v, want within [%v, %v]", c.name, doc.StartAfter, c.lo(), c.hi())
		}
		if diff := cmp.Diff([]*time.Time{doc.StartAfter, doc.StartAfter, nil}, []*time.Time{doc.NotBefore, doc.DueAt, doc.NudgeAt}); diff != "" {
			t.Fatalf("%s: not_before, due_at, nudge_at (-want +got):\n%s", c.name, diff)
		}
		v, err := e.api.Get(ctx, r.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if v.State != task.StateScheduled || v.StartAfter == nil || !v.StartAfter.Equal(*doc.StartAfter) {
			t.Fatalf("%s: GET %+v, want scheduled from %v", c.name, v, doc.StartAfter)
		}
		var first task.StreamEvent
		if err := e.api.Watch(ctx, r.TaskID, func(ev task.StreamEvent) error { first = ev; return errSeen }); !errors.Is(err, errSeen) ||
			first.Type != task.EventScheduled || first.Task == nil || first.Task.StartAfter == nil {
			t.Fatalf("%s: first event %+v (%v), want task.scheduled with its start", c.name, first, err)
		}
		again, err := e.api.SubmitWithKey(ctx, "delayed-"+c.name, req)
		if err != nil || !again.Replayed || again.TaskID != r.TaskID || again.State != task.StateScheduled {
			t.Fatalf("%s: replay %+v %v", c.name, again, err)
		}
		cancelled, err := e.api.Cancel(ctx, r.TaskID)
		if err != nil || cancelled.State != task.StateCancelled {
			t.Fatalf("%s: cancel %+v %v", c.name, cancelled, err)
		}
	}
	if n := len(e.pub.On(bus.TopicTasks)); n != 0 {
		t.Fatalf("delayed tasks published %d nudges, want none", n)
	}
	// A delay of zero is none: the task is queued and nudged at once.
	zero := validRequest()
	zero.Delay = "0s"
	if r := e.submit(zero); r.State != task.StateQueued {
		t.Fatalf("delay 0s: %q, want queued", r.State)
	}
	if n := len(e.pub.On(bus.TopicTasks)); n != 1 {
		t.Fatalf("%d nudges after an undelayed task, want 1", n)
	}
}

// A batch delays each item as it asks, and nudges only those that start at once.
func TestBatchDelayed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := []byte(`{"tasks":[{"family":"summarize","input":"a","delay":"10m"},{"family":"summarize","input":"b"},` +
		`{"family":"summarize","input":"c","delay":"-1s"}]}`)
	code, _, out := e.do("POST", "/v1/tasks:batch", e.key, body, nil)
	if code != http.StatusOK {
		t.Fatalf("batch: %d %s", code, out)
	}
	var res task.BatchResponse
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(res.Results))
	for i, r := range res.Results {
		got[i] = string(r.State)
		if r.Problem != nil {
			got[i] = "problem:" + fields(*r.Problem)[0]
		}
	}
	if diff := cmp.Diff([]string{"scheduled", "queued", "problem:delay"}, got); diff != "" {
		t.Fatalf("batch items (-want +got):\n%s", diff)
	}
	if msgs := e.pub.On(bus.TopicTasks); len(msgs) != 1 || msgs[0].Attrs[task.AttrTaskID] != res.Results[1].TaskID {
		t.Fatalf("nudges %+v, want one for the undelayed item", msgs)
	}
}

// Every bad start_after or delay is a 400 problem naming its field.
func TestDelayValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	now := time.Now()
	ts := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339Nano) }
	cases := []struct {
		name  string
		extra map[string]any
		field string
	}{
		{"both", map[string]any{"start_after": ts(time.Hour), "delay": "1h"}, "delay"},
		{"start_after past", map[string]any{"start_after": ts(-time.Minute)}, "start_after"},
		{"start_after beyond 30 days", map[string]any{"start_after": ts(task.MaxDelay + time.Hour)}, "start_after"},
		{"start_after malformed", map[string]any{"start_after": "tomorrow"}, "start_after"},
		{"start_after not a string", map[string]any{"start_after": 5}, "start_after"},
		{"start_after past run_before", map[string]any{"start_after": ts(2 * time.Hour), "run_before": ts(time.Hour)}, "start_after"},
		{"run_before malformed beside start_after", map[string]any{"start_after": ts(time.Hour), "run_before": "soon"}, "run_before"},
		{"delay malformed", map[string]any{"delay": "soon"}, "delay"},
		{"delay in days", map[string]any{"delay": "2d"}, "delay"},
		{"delay not a string", map[string]any{"delay": 90}, "delay"},
		{"delay negative", map[string]any{"delay": "-90s"}, "delay"},
		{"delay beyond 30 days", map[string]any{"delay": "721h"}, "delay"},
		{"delay past run_before", map[string]any{"delay": "2h", "run_before": ts(time.Hour)}, "delay"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			body := map[string]any{"family": "summarize", "input": "x"}
			for k, v := range c.extra {
				body[k] = v
			}
			code, h, out := e.do("POST", "/v1/tasks", e.key, mustJSON(t, body), nil)
			p := problemOf(t, h, out)
			if code != http.StatusBadRequest || p.Status != http.StatusBadRequest || !slices.Contains(fields(p), c.field) {
				t.Fatalf("status %d, fields %v; want 400 naming %q: %s", code, fields(p), c.field, out)
			}
		})
	}
	// At the bounds both are accepted.
	for _, extra := range []map[string]any{{"start_after": ts(task.MaxDelay - time.Minute)}, {"delay": "720h"}, {"delay": "1ms"}} {
		body := map[string]any{"family": "summarize", "input": "x"}
		for k, v := range extra {
			body[k] = v
		}
		if code, _, out := e.do("POST", "/v1/tasks", e.key, mustJSON(t, body), nil); code != http.StatusAccepted {
			t.Fatalf("%v: %d %s", extra, code, out)
		}
	}
}

// The OpenAPI pattern of delay accepts what the server reads as a duration that is not
// negative, and nothing else.
func TestDelayPatternMatchesParseDuration(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(delayPattern)
	for _, s := range []string{"90s", "1h30m", "0", "0s", "+5s", ".5s", "1.s", "1.5h", "300ms", "2us", "2µs", "2μs", "1h2m3s4ms5us6ns",
		"", "-1s", "5", "1d", "s", "1 s", "1h-2m", "++1s", ".s", "1e3s", "１s"} {
		d, err := time.ParseDuration(s)
		if want := err == nil && d >= 0; re.MatchString(s) != want {
			t.Errorf("%q: the pattern matches %v, the server reads it %v (%v, %v)", s, re.MatchString(s), want, d, err)
		}
	}
}
