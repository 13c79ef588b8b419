package dlqnotifier

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// maxFloodRounds bounds how often one caller posts a flood's message again for dead letters that
// joined while it posted; what is left is shown by the next dead letter of the flood.
const maxFloodRounds = 8

// floodCause is the cause under which delivery dead letter d of t joins its tenant's flood, or ""
// when it is paged on its own: only the receiver's own refusals group — a 4xx other than 408 and
// 429, or a redirect — which are the tenant's to fix, and which the tenant sees on the task; and
// only on a task no human has decided on yet: a delivery that dies after a Redeliver (round > 0),
// a Regenerate (replay > 0) or a Discard answers the human who asked for it.
func floodCause(t *protocol.Task, d *store.DeadLetter) string {
	if d.Stage != task.StageDelivery || d.State != store.DeadLetterOpen || d.Round != 0 || t.Replay != 0 ||
		t.State == task.StateDiscarded || d.EventID != t.Delivery.EventID || t.Delivery.State != task.DeliveryDead {
		return ""
	}
	switch s := t.Delivery.LastStatus; {
	case s >= 300 && s <= 399:
		return "redirect"
	case s >= 400 && s <= 499 && s != http.StatusRequestTimeout && s != http.StatusTooManyRequests:
		return "http-" + strconv.Itoa(s)
	}
	return ""
}

// flood counts delivery dead letter dlID of task id, whose notice n this instance holds at epoch,
// in its tenant's flood of cause, and reports whether it was counted there rather than to be
// posted on its own. The first of a window is posted on its own, with its buttons, and so is one
// whose flood cannot be read (paging is the safe side). A counted one stays open — decided with
// `genbox dlq`, the admin path or the console, or discarded by the tenant's erase of the task —
// and its notice is cleared; the flood's one message shows the count of the deliveries that
// died, which a decision does not change.
func (s *Service) flood(ctx context.Context, log *slog.Logger, id, dlID string, n protocol.Notice, epoch int64, d *store.DeadLetter, cause string) bool {
	first, err := s.store.JoinFlood(ctx, d.Tenant, cause, dlID, id, s.cfg.FloodWindow)
	if err != nil {
		log.WarnContext(ctx, "dlqnotifier: join flood; posted on its own", "error", err)
		return false
	}
	if first {
		return false
	}
	key := store.FloodKey(d.Tenant, cause)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitBudget)
	defer cancel()
	_, _, err = s.store.MutateDeadLetter(cctx, id, dlID, func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
		i := noticeIndex(t, n)
		if i < 0 || !t.Notices[i].Lease.HeldBy(s.cfg.Instance, epoch, now) {
			return store.ErrNoChange
		}
		d.SlackFlood = key
		t.Notices = slices.Delete(t.Notices, i, i+1)
		return nil
	})
	if err != nil {
		// The post lease expires and the notice comes back; the flood does not count it twice.
		log.ErrorContext(ctx, "dlqnotifier: record a dead letter counted in its flood", "error", err)
		return true
	}
	log.InfoContext(ctx, "dlqnotifier: dead letter counted in its tenant's flood", "flood", key)
	s.flushFlood(cctx, log, key)
	return true
}

// flushFlood posts the message of flood key, or updates it (chat.update), until it shows every
// dead letter counted — unless someone else holds the right to, who then does.
func (s *Service) flushFlood(ctx context.Context, log *slog.Logger, key string) {
	log = log.With("flood", key)
	for range maxFloodRounds {
		f, ok, err := s.store.ClaimFloodPost(ctx, key, s.cfg.PostLease)
		if err != nil {
			log.WarnContext(ctx, "dlqnotifier: claim flood message", "error", err)
			return
		}
		if !ok {
			return
		}
		text, blocks := floodMessage(f)
		pctx, cancel := context.WithTimeout(ctx, slackBudget)
		var channel, ts string
		if f.SlackTS == "" {
			channel, ts, err = s.slack.PostMessageContext(pctx, s.cfg.Channel, slack.MsgOptionText(text, false), slack.MsgOptionBlocks(blocks...))
		} else {
			channel, ts, _, err = s.slack.UpdateMessageContext(pctx, f.SlackChannel, f.SlackTS, slack.MsgOptionText(text, false), slack.MsgOptionBlocks(blocks...))
		}
		cancel()
		shown := f.Count
		if err != nil {
			log.WarnContext(ctx, "dlqnotifier: flood message not posted; the next dead letter of the flood tries again", "error", err)
			shown, channel, ts = f.Shown, "", ""
		}
		more, err := s.store.FloodPosted(ctx, key, f, shown, channel, ts)
		if err != nil {
			log.WarnContext(ctx, "dlqnotifier: record flood message", "error", err)
			return
		}
		if !more {
			return
		}
	}
}

// floodMessage is the text and blocks of a flood's message: how many dead letters it counts,
// of which tenant and cause, and where they are decided.
func floodMessage(f *store.Flood) (string, []slack.Block) {
	why := "the receiver answered with a redirect (never followed)"
	if code, ok := strings.CutPrefix(f.Cause, "http-"); ok {
		why = "the receiver answered HTTP " + esc(code)
	}
	text := fmt.Sprintf("%d more dead webhook deliveries of tenant %s: %s", f.Count, esc(f.Tenant), why)
	body := fmt.Sprintf(":repeat: *%d more webhook deliveries of tenant `%s` died the same way* since %s: %s.\n"+
		"They are not paged one by one (the first was posted on its own, with its buttons): the tenant sees each "+
		"task's delivery as dead, with its last status and error (`GET /v1/tasks/{id}`, `genbox get`), and each stays "+
		"open for Redeliver or Discard with `genbox dlq list`, the admin path or the console, unless the tenant erases "+
		"the task (`DELETE /v1/tasks/{id}` discards it). Latest task: `%s`.",
		f.Count, esc(f.Tenant), f.WindowStart.UTC().Format(time.RFC3339), why, esc(f.LastTaskID))
	return text, []slack.Block{slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, body, false, false), nil, nil)}
}
