package protocol

import (
	"slices"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// SupersedeDeadLetters closes the open delivery dead letters of t that its delivery has left behind: the
// dead delivery they were about was replaced by a newer event, or a regeneration moved the task
// to a new replay. Their buttons could only answer "moved on"; open, they would hold the task's
// TTL, its DELETE and the open-dead-letter alert forever. Their Slack messages are queued for an
// update. It returns their ids: the caller writes them closed in the same transaction.
func (t *Task) SupersedeDeadLetters() []string {
	var closed []string
	t.OpenDeadLetters = slices.DeleteFunc(t.OpenDeadLetters, func(id string) bool {
		_, n, err := ParseDeadLetterID(id)
		if err != nil || n.Stage != task.StageDelivery || deliveryCurrent(t, n) {
			return false
		}
		closed = append(closed, id)
		return true
	})
	if len(closed) == 0 {
		return nil
	}
	t.queueSlackUpdates(closed)
	return closed
}

// queueSlackUpdates asks for the Slack messages of dead letters ids to be updated, by the
// sweeper's slack_update nudge: due at once, as nobody else follows the write up.
func (t *Task) queueSlackUpdates(ids []string) {
	if t.SlackUpdate == nil {
		t.SlackUpdate = &Pending{}
	}
	for _, id := range ids {
		if !slices.Contains(t.SlackUpdate.Keys, id) {
			t.SlackUpdate.Keys = append(t.SlackUpdate.Keys, id)
		}
	}
}

// DiscardDeadDelivery gives up t's dead delivery, as the Discard of its dead letter decides: the
// next queued event, if any, goes out.
func (t *Task) DiscardDeadDelivery(now time.Time) {
	dl := &t.Delivery
	dl.State, dl.NextAttemptAt = task.DeliveryDiscarded, nil
	dl.Lease.Clear()
	t.AdvanceDelivery(now)
}

// deliveryCurrent reports whether t's delivery is still the dead one notice n announced.
func deliveryCurrent(t *Task, n Notice) bool {
	d := t.Delivery
	return t.Replay == n.Replay && d.State == task.DeliveryDead && d.Round == n.Round && (n.Event == "" || n.Event == d.EventID)
}

// DiscardDeliveryDeadLetters discards t's dead delivery when open dead letters announce it:
// they leave open_dead_letters and their Slack messages are queued for an update. It returns
// their ids, for the caller to write discarded in the same commit. The open delivery dead
// letters of earlier deliveries are left to supersede, in the same write.
func (t *Task) DiscardDeliveryDeadLetters(now time.Time) []string {
	var ids []string
	t.OpenDeadLetters = slices.DeleteFunc(t.OpenDeadLetters, func(id string) bool {
		_, n, err := ParseDeadLetterID(id)
		if err != nil || n.Stage != task.StageDelivery || !deliveryCurrent(t, n) {
			return false
		}
		ids = append(ids, id)
		return true
	})
	if len(ids) == 0 {
		return nil
	}
	t.DiscardDeadDelivery(now)
	t.queueSlackUpdates(ids)
	return ids
}

// GenerationDeadLetterOpen reports whether a dead letter of t's generation is open: a human may
// still regenerate the task.
func (t *Task) GenerationDeadLetterOpen() bool {
	return slices.ContainsFunc(t.OpenDeadLetters, func(id string) bool {
		_, n, err := ParseDeadLetterID(id)
		return err == nil && n.Stage == task.StageGeneration
	})
}
