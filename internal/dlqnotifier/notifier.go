// Package dlqnotifier is genbox's human gate (docs/architecture.md §7). It consumes the DLQ notices that the
// worker and the resulthandler keep as an outbox on a task, records each as a dead_letters
// document, and posts one Slack Block Kit message per dead letter with the buttons that apply to
// its stage: Redeliver (free) or Discard for a dead webhook delivery, Regenerate (~$estimate) or
// Discard for a dead generation. Only configured approvers may decide; a decision and the task's
// state change are one Firestore transaction, re-checked against the dead letter, so a second
// click answers who already decided. The same decision function serves the authenticated admin
// path for operators without Slack.
//
// It also takes Pub/Sub's own dead-lettered poison messages (recorded only when the task really
// is dead, else raised as an alert) and genbox-alerts, posted with a cooldown per alert key.
//
// Guarantees: one Slack message per dead letter. chat.postMessage has no idempotency key, so a
// duplicate post happens only if the process dies between Slack's 200 and the commit that stores
// the message's channel/ts (the post lease then expires and the sweeper re-sends the notice).
// Everything after a decision's commit — its nudges, the chat.update of the original message —
// is recorded on the task first (decision.topics, slack_update) and carried by the sweeper if
// this process dies; response_url is never relied on (it expires after 30 minutes).
package dlqnotifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/pubsub/v2"
	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Slack is the part of the Slack Web API the notifier calls (*slack.Client).
type Slack interface {
	PostMessageContext(ctx context.Context, channelID string, options ...slack.MsgOption) (string, string, error)
	UpdateMessageContext(ctx context.Context, channelID, timestamp string, options ...slack.MsgOption) (string, string, string, error)
	PostEphemeralContext(ctx context.Context, channelID, userID string, options ...slack.MsgOption) (string, error)
}

// Publisher publishes nudges and alerts (bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

// Estimator prices one more generation of a task: the Regenerate button's estimate. ok is false
// when no estimate can be made (the button then says so).
type Estimator interface {
	EstimateUSD(t *protocol.Task) (usd float64, ok bool)
}

var (
	_ Slack       = (*slack.Client)(nil)
	_ Publisher   = (*bus.Publisher)(nil)
	_ bus.Handler = (*Service)(nil)
)

// Message attribute values and Pub/Sub's dead-letter attributes.
const (
	KindNotice      = task.AttrKindNotice
	KindSlackUpdate = task.AttrKindSlackUpdate
	KindAlert       = task.AttrKindAlert
	// AttrDeadLetterSource is set by Pub/Sub on a message it dead-lettered: the subscription
	// whose consumer could not take it.
	AttrDeadLetterSource = "CloudPubSubDeadLetterSourceSubscription"
)

// NewSlackClient returns the Web API client of cfg: SLACK_BOT_TOKEN against GENBOX_SLACK_API_URL.
func NewSlackClient(cfg Config) *slack.Client {
	return slack.New(cfg.BotToken, slack.OptionAPIURL(cfg.SlackAPIURL+"/api/"))
}

// Service consumes the DLQ and alert topics and serves Slack interactions and the admin path.
// It is safe for concurrent use.
type Service struct {
	cfg   Config
	store *store.Store
	slack Slack
	pub   Publisher
	est   Estimator
	log   *slog.Logger

	approvers map[string]bool
	metrics   *obs.Metrics // nil records nothing
	// authFails throttles clients whose admin keys or Slack signatures keep failing.
	authFails *authlimit.Limiter
	// adminKey checks the admin path's Bearer key (GENBOX_ADMIN_KEY).
	adminKey httpapi.AdminKey

	// inHand holds the ids of the tasks whose notice or Slack update this instance is carrying: a
	// duplicate nudge for one of them is acked without a transaction (see carry).
	inHand bus.InHand
}

// New returns a Service. est may be nil: the Regenerate button then prices from the task's
// recorded spend (RecordedEstimator).
func New(cfg Config, st *store.Store, sl Slack, pub Publisher, est Estimator, log *slog.Logger, opts ...Option) *Service {
	if est == nil {
		est = RecordedEstimator{}
	}
	throttle := authlimit.DefaultConfig()
	throttle.TrustedHops = cfg.ProxyHops
	s := &Service{cfg: cfg, store: st, slack: sl, pub: pub, est: est, log: log, approvers: map[string]bool{},
		authFails: authlimit.New(throttle, func() time.Time { return st.Now() }),
		adminKey:  httpapi.NewAdminKey(cfg.AdminKey)}
	for _, id := range cfg.Approvers {
		s.approvers[id] = true
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Handle takes one message of gemini-tasks-dlq, gemini-results-dlq or genbox-alerts. It always
// acks: what needs doing again is recorded on the task, and the sweeper nudges it.
func (s *Service) Handle(ctx context.Context, m *bus.Message) bus.Result {
	a := m.Attributes
	id := a[task.AttrTaskID]
	log := s.log.With("message_id", m.ID, "task_id", id)
	switch {
	case a[task.AttrKind] == KindAlert || a[task.AttrAlert] != "":
		s.alert(ctx, a[task.AttrAlert], string(m.Data))
	case a[AttrDeadLetterSource] != "":
		s.poison(ctx, log, id, a[AttrDeadLetterSource], m)
	case id == "":
		log.WarnContext(ctx, "dlqnotifier: message without a task id; acked")
	case a[task.AttrKind] == KindNotice || a[task.AttrKind] == KindSlackUpdate:
		s.carry(ctx, log, id, a)
	default:
		log.WarnContext(ctx, "dlqnotifier: unknown message kind; acked", "kind", a[task.AttrKind])
	}
	return bus.Ack
}

// carry handles a notice or a Slack update nudge of task id. One for a task this instance already
// has in hand is acked without a transaction (bus.InHand): had the post lease lapsed while Slack was
// slow, it would post the dead letter a second time.
func (s *Service) carry(ctx context.Context, log *slog.Logger, id string, a map[string]string) {
	if !s.inHand.Take(id) {
		log.DebugContext(ctx, "dlqnotifier: task already in hand in this instance; acked", "kind", a[task.AttrKind])
		return
	}
	defer s.inHand.Delete(id)
	if a[task.AttrKind] == KindSlackUpdate {
		s.followUp(ctx, log, id)
		return
	}
	n, err := protocol.NoticeOf(a)
	if err != nil {
		log.WarnContext(ctx, "dlqnotifier: malformed notice; acked", "error", err)
		return
	}
	s.notice(ctx, log, id, n)
}

// Run pulls the three subscriptions until ctx ends (GENBOX_CONSUMER=pull).
func (s *Service) Run(ctx context.Context, ps *pubsub.Client) error {
	subs := []string{s.cfg.TasksDLQSub, s.cfg.ResultsDLQSub, s.cfg.AlertsSub}
	errs := make(chan error, len(subs))
	for _, sub := range subs {
		go func() {
			if err := bus.Pull(ctx, ps, sub, bus.PullSettings{MaxOutstandingMessages: 16}, s); err != nil {
				errs <- fmt.Errorf("pull %s: %w", sub, err)
				return
			}
			errs <- nil
		}()
	}
	var all []error
	for range subs {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
