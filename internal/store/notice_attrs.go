package store

import (
	"strconv"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Attributes are the Pub/Sub attributes of the DLQ notice message that announces n on task
// taskID: every publisher of a notice (worker, resulthandler, sweeper) sends these.
func (n Notice) Attributes(taskID string) map[string]string {
	return map[string]string{
		task.AttrTaskID: taskID,
		task.AttrStage:  string(n.Stage),
		task.AttrReplay: strconv.Itoa(n.Replay),
		task.AttrRound:  strconv.Itoa(n.Round),
		task.AttrKind:   "notice",
	}
}
