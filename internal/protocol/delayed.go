package protocol

import (
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Schedule makes a new task wait for its start time: scheduled until start, with not_before at
// start — so it is due then and its claim refuses it before — and without the nudge grace of a
// task nudged at submission: nobody nudges it but the sweeper, when it is due.
func (t *Task) Schedule(start time.Time) {
	sa, nb := start, start
	t.State = task.StateScheduled
	t.StartAfter, t.NotBefore = &sa, &nb
	t.NudgeAt = nil
}
