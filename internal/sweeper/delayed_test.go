package sweeper

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A scheduled task is not due, and not nudged, before its start; the first pass from its start
// on nudges it. Nothing else nudges it: its due_at is the start.
func TestPassNudgesAScheduledTaskAtItsStart(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	advance := storeClock(s)
	start := s.Now().Add(time.Hour)
	create(t, s, "later", func(d *protocol.Task) { d.Schedule(start) })
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "me")
	ctx := context.Background()
	advance(time.Hour - time.Millisecond)
	if _, err := sw.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if msgs := pub.Take(); len(msgs) != 0 {
		t.Fatalf("a pass a millisecond before the start nudged %+v", msgs)
	}
	advance(time.Millisecond)
	if _, err := sw.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := pub.Take()
	if len(msgs) != 1 || msgs[0].Topic != bus.TopicTasks || msgs[0].Attrs[task.AttrTaskID] != "later" {
		t.Fatalf("the pass at the start nudged %+v, want the task on %s", msgs, bus.TopicTasks)
	}
	doc, err := s.GetTask(ctx, "later")
	if err != nil {
		t.Fatal(err)
	}
	if doc.State != task.StateScheduled || doc.Nudges != 1 {
		t.Fatalf("after the nudge: state %s, nudges %d; want scheduled (the claim starts it), 1", doc.State, doc.Nudges)
	}
}
