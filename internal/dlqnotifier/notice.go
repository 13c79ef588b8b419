package dlqnotifier

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/safetext"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/backoff"
	"github.com/genbox-dev/genbox/pkg/task"
)

// slackBudget bounds one Slack Web API call.
const slackBudget = 5 * time.Second

// maxAlertText bounds an alert's text (escaped): it names models, subscriptions and task ids, and
// a fallback drill's report quotes model errors.
const maxAlertText = 2500

// noticeIndex finds the notice of t that announces the same dead letter as n, or -1.
func noticeIndex(t *protocol.Task, n protocol.Notice) int {
	return slices.IndexFunc(t.Notices, n.Announces)
}

// record fills a new dead letter from the task it belongs to. A delivery notice that arrives
// after the task moved past its delivery records the event it names, without the delivery's
// attempts (the task now holds a newer one's); the store closes it as superseded in the same
// commit.
func record(d *store.DeadLetter, t *protocol.Task, n protocol.Notice, now time.Time) {
	*d = store.DeadLetter{
		ID: d.ID, TaskID: t.ID, Tenant: t.Tenant, Family: t.Family, Variant: t.Variant,
		Stage: n.Stage, Replay: n.Replay, Round: n.Round, State: store.DeadLetterOpen,
		Usage: t.Usage, CostUSD: t.CostUSD, CreatedAt: now,
	}
	if n.Stage == task.StageDelivery {
		if n.Event != "" && n.Event != t.Delivery.EventID {
			d.EventID, d.LastError = n.Event, "the task had moved past this delivery when its notice was recorded"
			return
		}
		d.EventID, d.EventType = t.Delivery.EventID, t.Delivery.EventType
		d.Attempts, d.LastError = t.Delivery.Attempts, t.Delivery.LastError
		if d.LastError == "" && t.Delivery.LastStatus != 0 {
			d.LastError = "HTTP " + strconv.Itoa(t.Delivery.LastStatus)
		}
		return
	}
	d.Attempts = t.Attempts
	if t.Error != nil {
		d.LastError = string(t.Error.Kind) + ": " + t.Error.Message
	}
}

// notice records the dead letter of notice n on task id (idempotently: a notice can arrive more
// than once) and, under the notice's lease, posts its one Slack message; the message's
// channel/ts and the cleared notice are one commit after Slack answers.
func (s *Service) notice(ctx context.Context, log *slog.Logger, id string, n protocol.Notice) {
	dlID := n.DeadLetterID(id)
	log = log.With("dead_letter_id", dlID)
	var epoch int64
	t, d, err := s.store.MutateDeadLetter(ctx, id, dlID, func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
		epoch = 0
		i := noticeIndex(t, n)
		if i < 0 {
			return store.ErrNoChange // posted and cleared already, or never announced
		}
		changed := false
		if d.CreatedAt.IsZero() {
			record(d, t, n, now)
			changed = true
		}
		if d.State == store.DeadLetterOpen && !slices.Contains(t.OpenDeadLetters, dlID) {
			t.OpenDeadLetters = append(t.OpenDeadLetters, dlID)
			changed = true
		}
		if d.SlackTS != "" || d.SlackFlood != "" { // posted, or counted by its flood's message: only the notice was left behind
			t.Notices = slices.Delete(t.Notices, i, i+1)
			return nil
		}
		nt := &t.Notices[i]
		if nt.Lease.Live(now) {
			if changed {
				return nil
			}
			return store.ErrNoChange // someone is posting it; the sweeper re-sends if they die
		}
		if err := nt.Lease.Take(s.cfg.Instance, now, s.cfg.PostLease); err != nil {
			return err
		}
		epoch = nt.Lease.Epoch
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		log.WarnContext(ctx, "dlqnotifier: notice of a missing task; acked")
		return
	case err != nil:
		log.ErrorContext(ctx, "dlqnotifier: record dead letter; the sweeper re-sends the notice", "error", err)
		return
	case epoch == 0:
		log.DebugContext(ctx, "dlqnotifier: notice already posted or being posted")
		return
	}
	open := d.State == store.DeadLetterOpen // the message about to be posted has buttons
	if cause := floodCause(t, d); cause != "" && s.flood(ctx, log, id, dlID, n, epoch, d, cause) {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, slackBudget)
	channel, ts, perr := s.slack.PostMessageContext(pctx, s.cfg.Channel,
		slack.MsgOptionText(summary(d), false), slack.MsgOptionBlocks(s.blocks(d, t)...))
	cancel()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitBudget)
	defer cancel()
	if perr != nil {
		log.WarnContext(ctx, "dlqnotifier: Slack post failed; retried later", "error", perr)
		s.postFailed(cctx, log, id, dlID, n, epoch)
		return
	}
	decided := false
	_, _, err = s.store.MutateDeadLetter(cctx, id, dlID, func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
		decided = false
		if d.SlackTS == "" { // a concurrent poster whose lease we outlived keeps its own message
			d.SlackChannel, d.SlackTS = channel, ts
		}
		d.PostAttempts = 0
		if i := noticeIndex(t, n); i >= 0 {
			t.Notices = slices.Delete(t.Notices, i, i+1)
		}
		if d.State != store.DeadLetterOpen && open { // decided while the post was in flight: show it
			s.queueSlackUpdate(t, dlID, now)
			decided = true
		}
		return nil
	})
	if err != nil {
		// The post lease expires and the notice is sent again: the one duplicate the design admits.
		log.ErrorContext(ctx, "dlqnotifier: Slack message posted but not recorded", "slack_ts", ts, "error", err)
		return
	}
	log.InfoContext(ctx, "dlqnotifier: dead letter posted", "slack_channel", channel, "slack_ts", ts)
	if decided {
		s.followUp(cctx, log, id)
	}
}

// postFailed releases the post lease with a backoff on the notice's next_attempt_at: the
// sweeper re-sends the notice when it is due.
func (s *Service) postFailed(ctx context.Context, log *slog.Logger, id, dlID string, n protocol.Notice, epoch int64) {
	_, _, err := s.store.MutateDeadLetter(ctx, id, dlID, func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
		i := noticeIndex(t, n)
		if i < 0 || t.Notices[i].Lease.Release(s.cfg.Instance, epoch) != nil {
			return store.ErrNoChange
		}
		d.PostAttempts++
		next := now.Add(s.backoff(d.PostAttempts))
		t.Notices[i].NextAttemptAt = &next
		return nil
	})
	if err != nil {
		log.ErrorContext(ctx, "dlqnotifier: release post lease; it expires on its own", "error", err)
	}
}

// backoff is the capped exponential delay after n failed Slack calls.
func (s *Service) backoff(n int) time.Duration {
	return backoff.Policy{Base: s.cfg.PostBackoffBase, Max: s.cfg.PostBackoffMax}.Ceiling(n)
}

// queueSlackUpdate asks for the original message of dlID to be updated; the sweeper carries it
// after the grace if this process does not.
func (s *Service) queueSlackUpdate(t *protocol.Task, dlID string, now time.Time) {
	if t.SlackUpdate == nil {
		t.SlackUpdate = &protocol.Pending{}
	}
	if !slices.Contains(t.SlackUpdate.Keys, dlID) {
		t.SlackUpdate.Keys = append(t.SlackUpdate.Keys, dlID)
	}
	at := now.Add(s.cfg.FollowUpGrace)
	t.SlackUpdate.NextAttemptAt = &at
}

// poison handles a message Pub/Sub dead-lettered from source: recorded as a dead letter (through
// the notice outbox) only if its task really is dead at that stage; otherwise an alert.
func (s *Service) poison(ctx context.Context, log *slog.Logger, id, source string, m *bus.Message) {
	stage := task.StageGeneration
	if source == bus.SubResults || strings.HasSuffix(source, "/"+bus.SubResults) {
		stage = task.StageDelivery
	}
	log = log.With("source_subscription", source, "stage", string(stage))
	var n protocol.Notice
	dead := false
	if id != "" {
		t, err := s.store.GetTask(ctx, id)
		if err == nil {
			n = protocol.Notice{Stage: stage, Replay: t.Replay, Round: t.Delivery.Round, Event: t.Delivery.EventID}
			if stage == task.StageGeneration {
				n.Round, n.Event = 0, ""
			}
			_, _, err = s.store.MutateDeadLetter(ctx, id, n.DeadLetterID(id), func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
				dead = false
				if stage == task.StageGeneration && (t.State != task.StateDead || t.Replay != n.Replay) ||
					stage == task.StageDelivery && (t.Delivery.State != task.DeliveryDead || t.Delivery.Round != n.Round || t.Delivery.EventID != n.Event || t.Replay != n.Replay) {
					return store.ErrNoChange
				}
				dead = true
				if !d.CreatedAt.IsZero() || noticeIndex(t, n) >= 0 {
					return store.ErrNoChange // already recorded, or its notice is on its way
				}
				t.Notices = append(t.Notices, n)
				return nil
			})
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			log.ErrorContext(ctx, "dlqnotifier: poison message: read task", "error", err)
		}
	}
	if dead {
		log.InfoContext(ctx, "dlqnotifier: poison message of a dead task; recorded")
		s.notice(ctx, log, id, n)
		return
	}
	log.WarnContext(ctx, "dlqnotifier: poison message of a task that is not dead; alert raised")
	text := "Pub/Sub dead-lettered a message from " + source + " for task " + id +
		" that is not dead (" + strconv.Itoa(m.DeliveryAttempt) + " deliveries): the consumer fails on it."
	if _, err := s.pub.Publish(ctx, bus.TopicAlerts, []byte(text), map[string]string{
		task.AttrKind: KindAlert, task.AttrAlert: "poison:" + source, task.AttrTaskID: id,
	}); err != nil {
		log.ErrorContext(ctx, "dlqnotifier: publish poison alert", "error", err)
	}
}

// alert posts an alert unless one of the same key was posted within the cooldown (decided in a
// Firestore transaction, so two instances never both post).
func (s *Service) alert(ctx context.Context, key, text string) {
	if key == "" {
		key = "unkeyed"
	}
	log := s.log.With("alert_key", key)
	post, prev, err := s.store.ClaimAlert(ctx, key, s.cfg.AlertCooldown)
	if err != nil {
		log.ErrorContext(ctx, "dlqnotifier: alert cooldown", "error", err)
		return
	}
	if !post {
		log.DebugContext(ctx, "dlqnotifier: alert within its cooldown; not posted")
		return
	}
	pctx, cancel := context.WithTimeout(ctx, slackBudget)
	defer cancel()
	msg := ":rotating_light: *genbox alert* `" + esc(key) + "`\n" + safetext.Slack(text, maxAlertText)
	if _, _, err := s.slack.PostMessageContext(pctx, s.cfg.Channel, slack.MsgOptionText(msg, false)); err != nil {
		log.WarnContext(ctx, "dlqnotifier: alert not posted; the next one of its key will be", "error", err)
		if err := s.store.UnclaimAlert(context.WithoutCancel(ctx), key, prev); err != nil {
			log.ErrorContext(ctx, "dlqnotifier: unclaim alert", "error", err)
		}
		return
	}
	log.InfoContext(ctx, "dlqnotifier: alert posted")
}
