package dlqnotifier

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/safetext"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Slack request signature headers.
const (
	HeaderSlackSignature = "X-Slack-Signature"
	HeaderSlackTimestamp = "X-Slack-Request-Timestamp"
)

// MaxInteractionBytes caps an interaction request body; Slack's block_actions payloads carry the
// original message and stay far below it.
const MaxInteractionBytes = 256 << 10

// Bounds of the tenant-influenced text in a message, escaped (safetext.Slack): a Block Kit
// section holds at most 3000 characters.
const (
	maxErrorText = 500
	maxFieldText = 200
)

// esc is a tenant-influenced field as a message shows it: escaped for mrkdwn and bounded.
func esc(s string) string { return safetext.Slack(s, maxFieldText) }

// slackMention is how a decision by a Slack user is recorded: a mention of their verified id.
var slackMention = regexp.MustCompile(`^<@[A-Z0-9]+>$`)

// decider shows who decided: a Slack user as the mention recorded from their verified click, an
// operator of the admin path (a name they typed) escaped.
func decider(by string) string {
	if slackMention.MatchString(by) {
		return by
	}
	return esc(by)
}

// SignSlackRequest returns the headers Slack sends with body at ts: the v0 signature over
// "v0:{ts}:{body}" with the signing secret. Tests and the `genbox dev` Slack console sign with it.
func SignSlackRequest(secret string, ts time.Time, body []byte) http.Header {
	stamp := strconv.FormatInt(ts.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%s:", stamp)
	mac.Write(body)
	h := http.Header{}
	h.Set(HeaderSlackTimestamp, stamp)
	h.Set(HeaderSlackSignature, "v0="+hex.EncodeToString(mac.Sum(nil)))
	return h
}

// verifySlack checks body's v0 signature and its 5-minute timestamp window.
func verifySlack(h http.Header, body []byte, secret string) error {
	v, err := slack.NewSecretsVerifier(h, secret)
	if err != nil {
		return err
	}
	if _, err := v.Write(body); err != nil {
		return err
	}
	return v.Ensure()
}

// ErrBadPayload means an interaction request is not a Slack interaction payload.
var ErrBadPayload = errors.New("dlqnotifier: bad Slack interaction payload")

// DecodeInteraction decodes a verified interaction request body: a form whose payload field is
// the JSON interaction callback.
func DecodeInteraction(body []byte) (*slack.InteractionCallback, error) {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	payload := form.Get("payload")
	if payload == "" {
		return nil, fmt.Errorf("%w: no payload field", ErrBadPayload)
	}
	var cb slack.InteractionCallback
	if err := json.Unmarshal([]byte(payload), &cb); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	return &cb, nil
}

// summary is a message's plain-text fallback (notifications, screen readers).
func summary(d *store.DeadLetter) string {
	return fmt.Sprintf("Dead letter: task %s, %s stage (%s)", esc(d.TaskID), d.Stage, d.State)
}

// blocks renders a dead letter: what died, what it cost, and either its buttons (open) or who
// decided what and when. t (the task, when at hand) prices the Regenerate button. Every field a
// tenant, a receiver or a model can influence is escaped and bounded: a receiver's error text
// must neither ping the channel nor draw a link next to the buttons.
func (s *Service) blocks(d *store.DeadLetter, t *protocol.Task) []slack.Block {
	errText := safetext.Slack(d.LastError, maxErrorText)
	if errText == "" {
		errText = "(none recorded)"
	}
	what := "generation"
	if d.Stage == task.StageDelivery {
		what = "webhook delivery of `" + esc(string(d.EventType)) + "` (webhook-id `" + esc(d.EventID) + "`, round " + strconv.Itoa(d.Round) + ")"
	}
	text := fmt.Sprintf("*Dead letter* — the %s of task `%s` died.\n"+
		"*Tenant:* %s   *Family:* %s/%s   *Stage:* %s   *Replay:* %d\n"+
		"*Attempts:* %d   *Spent:* %d tokens (%d in, %d out), $%.6f\n*Last error:* %s",
		what, esc(d.TaskID), esc(d.Tenant), esc(d.Family), esc(d.Variant), d.Stage, d.Replay,
		d.Attempts, d.Usage.TotalTokens, d.Usage.PromptTokens, d.Usage.OutputTokens, d.CostUSD, errText)
	out := []slack.Block{slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, text, false, false), nil, nil)}
	if d.State != store.DeadLetterOpen {
		at := ""
		if d.DecidedAt != nil {
			at = d.DecidedAt.UTC().Format(time.RFC3339)
		}
		done := fmt.Sprintf("*%s* by %s at %s", decidedWord(d.State), decider(d.DecidedBy), at)
		if d.State == store.DeadLetterSuperseded {
			done = "*Superseded* at " + at + ": the task moved on (a newer event or a regeneration replaced this delivery); nothing is left to decide."
		}
		return append(out, slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, done, false, false), nil, nil))
	}
	var buttons []slack.BlockElement
	if d.Stage == task.StageDelivery {
		buttons = append(buttons, button(ActionRedeliver, "Redeliver (free)", d.ID).WithStyle(slack.StylePrimary))
	} else {
		label := "Regenerate (estimate unknown)"
		if t != nil {
			if usd, ok := s.est.EstimateUSD(t); ok {
				label = fmt.Sprintf("Regenerate (~$%.4f)", usd)
			}
		}
		buttons = append(buttons, button(ActionRegenerate, label, d.ID).WithStyle(slack.StylePrimary))
	}
	buttons = append(buttons, button(ActionDiscard, "Discard", d.ID).WithStyle(slack.StyleDanger))
	return append(out, slack.NewActionBlock("dlq:"+d.ID, buttons...))
}

func button(a Action, label, value string) *slack.ButtonBlockElement {
	return slack.NewButtonBlockElement(string(a), value, slack.NewTextBlockObject(slack.PlainTextType, label, false, false))
}

func decidedWord(st store.DeadLetterState) string {
	switch st {
	case store.DeadLetterRedelivered:
		return "Redelivered"
	case store.DeadLetterRegenerated:
		return "Regenerated"
	case store.DeadLetterDiscarded:
		return "Discarded"
	}
	return string(st)
}

// RecordedEstimator prices a regeneration from what the dead replay already spent per model
// call (its attempts all failed, so each cost about the same); without recorded calls it has
// no estimate.
type RecordedEstimator struct{}

var _ Estimator = RecordedEstimator{}

// EstimateUSD implements Estimator.
func (RecordedEstimator) EstimateUSD(t *protocol.Task) (float64, bool) {
	if t.ModelCalls <= 0 || t.CostUSD <= 0 {
		return 0, false
	}
	return t.CostUSD / float64(t.ModelCalls), true
}
