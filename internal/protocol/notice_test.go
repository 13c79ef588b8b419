package protocol_test

import (
	"testing"

	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Dead letter ids round-trip — the generation form, the delivery form naming its event, and the
// delivery form recorded before notices named their event — and anything else is refused.
func TestParseDeadLetterID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		ok    bool
		task  string
		event string
	}{
		{"abc:generation:0:0", true, "abc", ""},
		{"abc:delivery:3:7", true, "abc", ""},
		{"abc:delivery:0:0:task.dead.0", true, "abc", "abc.task.dead.0"},
		{"abc:delivery:1:2:task.discarded.0", true, "abc", "abc.task.discarded.0"},
		{"abc:generation:0:0:task.dead.0", false, "", ""},
		{"abc:delivery:0:0:", false, "", ""},
		{"abc:delivery:-1:0", false, "", ""},
		{"abc:other:0:0", false, "", ""},
		{":generation:0:0", false, "", ""},
		{":delivery:0:0:task.dead.0", false, "", ""},
		{"abc:generation:0", false, "", ""},
		{"abc:generation:01:0", false, "", ""},
		{"abc:generation:0:x", false, "", ""},
	} {
		id, n, err := protocol.ParseDeadLetterID(tc.in)
		if (err == nil) != tc.ok || id != tc.task || n.Event != tc.event {
			t.Errorf("%q: task %q event %q, %v; want ok %v, task %q, event %q", tc.in, id, n.Event, err, tc.ok, tc.task, tc.event)
		}
		if tc.ok && n.DeadLetterID(id) != tc.in {
			t.Errorf("%q does not round-trip: %q", tc.in, n.DeadLetterID(id))
		}
	}
}

// Two events of one task dying in the same replay and round — task.dead, then the
// task.discarded of its Discard — name two dead letters; a notice's attributes carry its event.
func TestDeliveryDeadLetterIDNamesTheEvent(t *testing.T) {
	t.Parallel()
	dead := protocol.Notice{Stage: task.StageDelivery, Event: task.EventID("t1", task.EventDead, 0)}
	discarded := protocol.Notice{Stage: task.StageDelivery, Event: task.EventID("t1", task.EventDiscarded, 0)}
	if a, b := dead.DeadLetterID("t1"), discarded.DeadLetterID("t1"); a == b {
		t.Fatalf("both deliveries name dead letter %q", a)
	}
	back, err := protocol.NoticeOf(discarded.Attributes("t1"))
	if err != nil || !back.Announces(discarded) {
		t.Errorf("notice from its attributes: %+v %v, want %+v", back, err, discarded)
	}
}
