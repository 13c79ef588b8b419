package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Attributes are the Pub/Sub attributes of the DLQ notice message that announces n on task
// taskID: every publisher of a notice (worker, resulthandler, sweeper) sends these.
func (n Notice) Attributes(taskID string) map[string]string {
	a := map[string]string{
		task.AttrTaskID: taskID,
		task.AttrStage:  string(n.Stage),
		task.AttrReplay: strconv.Itoa(n.Replay),
		task.AttrRound:  strconv.Itoa(n.Round),
		task.AttrKind:   task.AttrKindNotice,
	}
	if n.Event != "" {
		a[task.AttrEvent] = n.Event
	}
	return a
}

// ErrBadNotice means a notice message's attributes do not name a dead letter.
var ErrBadNotice = errors.New("protocol: bad notice attributes")

// NoticeOf reads the notice a message's attributes announce (the inverse of Attributes). A
// delivery notice published before notices named their event has none.
func NoticeOf(a map[string]string) (Notice, error) {
	var n Notice
	n.Stage = task.Stage(a[task.AttrStage])
	if n.Stage != task.StageGeneration && n.Stage != task.StageDelivery {
		return n, fmt.Errorf("%w: stage %q", ErrBadNotice, a[task.AttrStage])
	}
	var err1, err2 error
	n.Replay, err1 = strconv.Atoi(a[task.AttrReplay])
	n.Round, err2 = strconv.Atoi(a[task.AttrRound])
	if err := errors.Join(err1, err2); err != nil || n.Replay < 0 || n.Round < 0 {
		return n, fmt.Errorf("%w: replay %q round %q", ErrBadNotice, a[task.AttrReplay], a[task.AttrRound])
	}
	n.Event = a[task.AttrEvent]
	if n.Event != "" && (n.Stage != task.StageDelivery || eventSuffix(a[task.AttrTaskID], n.Event) == "") {
		return n, fmt.Errorf("%w: event %q", ErrBadNotice, n.Event)
	}
	return n, nil
}

// DeadLetterID names a dead_letters document: {task_id}:{stage}:{replay}:{round}, as a generation
// dead letter and a delivery dead letter recorded before notices named their event are named.
func DeadLetterID(taskID string, stage task.Stage, replay, round int) string {
	return taskID + ":" + string(stage) + ":" + strconv.Itoa(replay) + ":" + strconv.Itoa(round)
}

// DeadLetterID names the dead_letters document of a notice. A delivery notice that names its
// event adds it: {task_id}:delivery:{replay}:{round}:{type}.{event replay}, so that a second
// event dying in the same replay and round (task.dead, then the task.discarded of its Discard)
// gets a dead letter of its own.
func (n Notice) DeadLetterID(taskID string) string {
	id := DeadLetterID(taskID, n.Stage, n.Replay, n.Round)
	if n.Event != "" {
		id += ":" + eventSuffix(taskID, n.Event)
	}
	return id
}

// eventSuffix is the part of an event id ({task_id}.{type}.{replay}) after the task id, or ""
// when eventID is not an event of taskID.
func eventSuffix(taskID, eventID string) string {
	s, ok := strings.CutPrefix(eventID, taskID+".")
	if !ok || s == "" || strings.Contains(s, ":") {
		return ""
	}
	return s
}

// ErrBadDeadLetterID means a string is not a dead letter id.
var ErrBadDeadLetterID = errors.New("protocol: bad dead letter id")

// ParseDeadLetterID splits a dead letter id into its task id and the notice it records: both
// forms of Notice.DeadLetterID. Task ids may not contain ':'; the split is from the right all the
// same.
func ParseDeadLetterID(id string) (taskID string, n Notice, err error) {
	parts := strings.Split(id, ":")
	k := len(parts)
	event := ""
	if k >= 5 && parts[k-4] == string(task.StageDelivery) {
		event, parts, k = parts[k-1], parts[:k-1], k-1
	}
	if k < 4 {
		return "", n, fmt.Errorf("%w: %q", ErrBadDeadLetterID, id)
	}
	taskID = strings.Join(parts[:k-3], ":")
	a := map[string]string{task.AttrTaskID: taskID, task.AttrStage: parts[k-3], task.AttrReplay: parts[k-2], task.AttrRound: parts[k-1]}
	if event != "" {
		a[task.AttrEvent] = taskID + "." + event
	}
	n, err = NoticeOf(a)
	if err != nil || taskID == "" || n.DeadLetterID(taskID) != id {
		return "", Notice{}, fmt.Errorf("%w: %q", ErrBadDeadLetterID, id)
	}
	return taskID, n, nil
}
