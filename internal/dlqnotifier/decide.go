package dlqnotifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Action is a human's decision on a dead letter.
type Action string

// Actions: Redeliver and Discard apply to the delivery stage, Regenerate and Discard to the
// generation stage.
const (
	ActionRedeliver  Action = "redeliver"
	ActionRegenerate Action = "regenerate"
	ActionDiscard    Action = "discard"
)

// decided is the dead letter state each action leaves.
var decided = map[Action]store.DeadLetterState{
	ActionRedeliver: store.DeadLetterRedelivered, ActionRegenerate: store.DeadLetterRegenerated, ActionDiscard: store.DeadLetterDiscarded,
}

// followUpBudget bounds the follow-up a decision runs before its answer (Slack waits 3 s).
const followUpBudget = 2 * time.Second

// commitBudget bounds a commit that must happen even while the request or shutdown ends.
const commitBudget = 10 * time.Second

// Decision errors.
var (
	// ErrAction means the action does not apply to the dead letter's stage.
	ErrAction = errors.New("dlqnotifier: action does not apply to this dead letter")
	// ErrMovedOn means the task is no longer what the dead letter was about (for example its
	// delivery was redelivered and succeeded by another path); nothing was changed.
	ErrMovedOn = errors.New("dlqnotifier: the task has moved on since this dead letter")
)

// DecidedError answers a decision on a dead letter someone already decided.
type DecidedError struct {
	State store.DeadLetterState
	By    string
	At    time.Time
}

func (e *DecidedError) Error() string {
	at := e.At.UTC().Format(time.RFC3339)
	if e.State == store.DeadLetterSuperseded {
		return "superseded at " + at + ": the task moved on (a newer event or a regeneration replaced this delivery)"
	}
	return fmt.Sprintf("already decided by %s at %s (%s)", e.By, at, e.State)
}

// appliesTo reports whether a applies at stage.
func (a Action) appliesTo(stage task.Stage) bool {
	switch a {
	case ActionDiscard:
		return true
	case ActionRedeliver:
		return stage == task.StageDelivery
	case ActionRegenerate:
		return stage == task.StageGeneration
	}
	return false
}

// Decide applies a human's decision on dead letter id — from Slack or the admin path — in one
// transaction with the task's state change, after re-checking that the dead letter is open and
// the task still what it was about. Then it publishes the decision's nudges and updates the
// Slack message before returning; whatever it cannot finish is on the task for the sweeper.
func (s *Service) Decide(ctx context.Context, id string, action Action, by string) (*store.DeadLetter, error) {
	taskID, _, err := protocol.ParseDeadLetterID(id)
	if err != nil {
		return nil, err
	}
	log := s.log.With("task_id", taskID, "dead_letter_id", id, "action", string(action), "by", by)
	t, d, err := s.store.MutateDeadLetter(ctx, taskID, id, func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
		if d.CreatedAt.IsZero() {
			return store.ErrNotFound
		}
		if d.State != store.DeadLetterOpen {
			at := time.Time{}
			if d.DecidedAt != nil {
				at = *d.DecidedAt
			}
			return &DecidedError{State: d.State, By: d.DecidedBy, At: at}
		}
		if !action.appliesTo(d.Stage) {
			return fmt.Errorf("%w: %s on the %s stage", ErrAction, action, d.Stage)
		}
		topics, err := apply(t, d, action, now)
		if err != nil {
			return err
		}
		d.State = decided[action]
		d.DecidedBy, d.DecidedAt, d.Applied = by, &now, len(topics) == 0
		t.OpenDeadLetters = slices.DeleteFunc(t.OpenDeadLetters, func(e string) bool { return e == id })
		if prev := t.Decision; prev != nil { // an earlier decision's unpublished nudges are kept
			for _, topic := range prev.Topics {
				if !slices.Contains(topics, topic) {
					topics = append(topics, topic)
				}
			}
		}
		grace := now.Add(s.cfg.FollowUpGrace)
		t.Decision = &protocol.Decision{DeadLetterID: id, Action: string(action), By: by, At: now, Topics: topics, NextAttemptAt: &grace}
		// Always queued, posted or not: the sweeper's slack_update nudge is also what brings a
		// decision whose nudges it re-published back here to be marked done.
		s.queueSlackUpdate(t, id, now)
		s.holdSweeper(t, now)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decide %s on %s: %w", action, id, err)
	}
	log.InfoContext(ctx, "dlqnotifier: decision recorded")
	s.countDecision(ctx, t, action)
	// Cloud Run may throttle CPU once the response is sent: the follow-up runs now, bounded so
	// that Slack still gets its answer within 3 s; what does not finish is the sweeper's.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), followUpBudget)
	defer cancel()
	s.followUp(fctx, log, taskID)
	return d, nil
}

// apply changes the task per action, after checking it is still what the dead letter was about,
// and returns the topics to nudge.
func apply(t *protocol.Task, d *store.DeadLetter, action Action, now time.Time) ([]string, error) {
	if t.Replay != d.Replay {
		return nil, fmt.Errorf("%w: replay %d, the dead letter is of replay %d", ErrMovedOn, t.Replay, d.Replay)
	}
	if d.Stage == task.StageGeneration {
		if t.State != task.StateDead {
			return nil, fmt.Errorf("%w: the task is %s", ErrMovedOn, t.State)
		}
		if action == ActionDiscard {
			t.Finish(task.StateDiscarded, now)
			return deliveryNudge(t), nil
		}
		t.Regenerate()
		return []string{bus.TopicTasks}, nil
	}
	dl := &t.Delivery
	if dl.State != task.DeliveryDead || dl.EventID != d.EventID || dl.Round != d.Round {
		return nil, fmt.Errorf("%w: delivery %s of %s round %d", ErrMovedOn, dl.State, dl.EventID, dl.Round)
	}
	if action == ActionDiscard {
		t.DiscardDeadDelivery(now)
		return deliveryNudge(t), nil
	}
	// Redeliver: the same event (same webhook-id, same frozen payload), a new round.
	dl.State = task.DeliveryPending
	dl.Round++
	dl.Attempts = 0
	dl.FirstAttemptAt, dl.DeliveredAt = nil, nil
	dl.NextAttemptAt = &now
	dl.LastStatus, dl.LastError = 0, ""
	dl.Lease.Clear()
	return []string{bus.TopicResults}, nil
}

func deliveryNudge(t *protocol.Task) []string {
	if t.Delivery.State == task.DeliveryPending {
		return []string{bus.TopicResults}
	}
	return nil
}

// holdSweeper keeps the sweeper off t until the decision grace ends, while the decided work is
// not yet taken (no task or delivery lease): the decider publishes the nudges itself right after
// its commit, and every write resets the sweeper's backoff, so without it a regenerated (queued)
// task or a redelivered (pending) webhook is due at once and the sweeper sends a second nudge
// whose claim races the first. A lost nudge is still the sweeper's after the grace.
func (s *Service) holdSweeper(t *protocol.Task, now time.Time) {
	d := t.Decision
	if d == nil || t.State == task.StateRunning || t.Delivery.Lease.Live(now) {
		return
	}
	if at := d.At.Add(s.cfg.FollowUpGrace); now.Before(at) {
		t.NudgeAt = &at
	}
}

// followUp carries what a decision left on task id: its unpublished nudges, then the chat.update
// of each decided dead letter's message. Each part is cleared once done; what fails stays on the
// task with a backoff, and the sweeper sends a slack_update nudge for it.
func (s *Service) followUp(ctx context.Context, log *slog.Logger, id string) {
	t, err := s.store.GetTask(ctx, id)
	if err != nil {
		log.WarnContext(ctx, "dlqnotifier: follow-up: read task", "error", err)
		return
	}
	if dec := t.Decision; dec != nil && len(dec.Topics) > 0 {
		var failed error
		for _, topic := range dec.Topics {
			if _, err := s.pub.Publish(ctx, topic, nil, map[string]string{task.AttrTaskID: id}); err != nil {
				failed = errors.Join(failed, err)
			}
		}
		if failed != nil {
			log.WarnContext(ctx, "dlqnotifier: decision nudge not published; the sweeper will", "error", failed)
		} else {
			s.decisionApplied(ctx, log, id, dec.DeadLetterID)
		}
	}
	if t.SlackUpdate == nil {
		return
	}
	var done []string
	var failed bool
	for _, key := range t.SlackUpdate.Keys {
		if s.updateMessage(ctx, log, key) {
			done = append(done, key)
		} else {
			failed = true
		}
	}
	_, err = s.store.MutateTask(ctx, id, func(t *protocol.Task, now time.Time) error {
		if t.SlackUpdate == nil {
			return store.ErrNoChange
		}
		t.SlackUpdate.Keys = slices.DeleteFunc(t.SlackUpdate.Keys, func(k string) bool { return slices.Contains(done, k) })
		if len(t.SlackUpdate.Keys) == 0 {
			t.SlackUpdate = nil
		} else if failed {
			next := now.Add(s.cfg.PostBackoffBase)
			t.SlackUpdate.NextAttemptAt = &next
		}
		s.holdSweeper(t, now)
		return nil
	})
	if err != nil {
		log.WarnContext(ctx, "dlqnotifier: record Slack update", "error", err)
	}
}

// decisionApplied clears the decision's topics once its nudges are published and marks the dead
// letter applied.
func (s *Service) decisionApplied(ctx context.Context, log *slog.Logger, id, dlID string) {
	_, _, err := s.store.MutateDeadLetter(ctx, id, dlID, func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
		if t.Decision == nil || t.Decision.DeadLetterID != dlID || len(t.Decision.Topics) == 0 {
			return store.ErrNoChange
		}
		t.Decision.Topics, t.Decision.NextAttemptAt = nil, nil
		if !d.CreatedAt.IsZero() {
			d.Applied = true
		}
		s.holdSweeper(t, now)
		return nil
	})
	if err != nil {
		log.WarnContext(ctx, "dlqnotifier: clear published decision; the sweeper re-nudges (harmless)", "error", err)
	}
}

// updateMessage rewrites the Slack message of dead letter key to show its decision. It reports
// whether nothing is left to do (done, or nothing to update).
func (s *Service) updateMessage(ctx context.Context, log *slog.Logger, key string) bool {
	d, err := s.store.GetDeadLetter(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return true
	}
	if err != nil {
		log.WarnContext(ctx, "dlqnotifier: read dead letter for its Slack update", "dead_letter_id", key, "error", err)
		return false
	}
	if d.SlackTS == "" {
		return true // never posted: the post will show the decision
	}
	uctx, cancel := context.WithTimeout(ctx, slackBudget)
	defer cancel()
	if _, _, _, err := s.slack.UpdateMessageContext(uctx, d.SlackChannel, d.SlackTS,
		slack.MsgOptionText(summary(d), false), slack.MsgOptionBlocks(s.blocks(d, nil)...)); err != nil {
		log.WarnContext(ctx, "dlqnotifier: chat.update failed; retried later", "dead_letter_id", key, "error", err)
		return false
	}
	return true
}
