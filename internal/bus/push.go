package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/pkg/task"
)

// MaxPushBytes caps a push request body. Pub/Sub messages are at most 10 MB; the envelope's
// base64 and JSON add a third, which a legitimate push never needs for genbox's nudges.
const MaxPushBytes = 10 << 20

// ErrBadEnvelope means a push request body is not a Pub/Sub push envelope.
var ErrBadEnvelope = errors.New("bus: bad push envelope")

// errTooLarge means a push request body exceeds MaxPushBytes.
var errTooLarge = errors.New("bus: push body too large")

// pushEnvelope is the JSON body of a Pub/Sub push request (wrapped payload).
type pushEnvelope struct {
	Message         *pushMessage `json:"message"`
	Subscription    string       `json:"subscription"`
	DeliveryAttempt *int         `json:"deliveryAttempt,omitempty"`
}

// pushMessage is a message inside a push envelope. Pub/Sub sends the id and publish time under
// both their camelCase and snake_case names.
type pushMessage struct {
	Data             []byte            `json:"data,omitempty"` // base64
	Attributes       map[string]string `json:"attributes,omitempty"`
	MessageID        string            `json:"messageId,omitempty"`
	MessageIDSnake   string            `json:"message_id,omitempty"`
	PublishTime      *time.Time        `json:"publishTime,omitempty"`
	PublishTimeSnake *time.Time        `json:"publish_time,omitempty"`
	OrderingKey      string            `json:"orderingKey,omitempty"`
}

// Push returns the http.Handler of a Pub/Sub push subscription: it decodes the push envelope,
// calls h with the trace context of the message's attributes, and answers 204 on Ack (Pub/Sub
// acks on any 2xx) and 503 on Nack. A body that is not a push envelope gets a 4xx without calling
// h; Pub/Sub treats it as a nack, so a poison request ends on the dead-letter topic.
// Authenticating the pusher (OIDC) is the job of a middleware wrapped around this handler.
func Push(h Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeProblem(w, http.StatusMethodNotAllowed, "push requests are POST")
			return
		}
		m, sub, err := decodePush(http.MaxBytesReader(w, r.Body, MaxPushBytes))
		if err != nil {
			log.WarnContext(r.Context(), "push: rejected request", "error", err)
			writeProblem(w, pushStatus(err), err.Error())
			return
		}
		res := process(r.Context(), h, pushSubscription(sub), m)
		log.DebugContext(r.Context(), "push: handled", "subscription", sub, "message_id", m.ID,
			"delivery_attempt", m.DeliveryAttempt, "result", res.String())
		if res == Ack {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
}

// decodePush decodes one push envelope strictly: unknown fields, wrong types, bad base64,
// trailing data or a missing message id are errors.
func decodePush(r io.Reader) (*Message, string, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var env pushEnvelope
	if err := dec.Decode(&env); err != nil {
		return nil, "", readErr(err)
	}
	switch _, err := dec.Token(); {
	case err == nil:
		return nil, "", fmt.Errorf("%w: data after the envelope", ErrBadEnvelope)
	case !errors.Is(err, io.EOF):
		return nil, "", readErr(err)
	}
	pm := env.Message
	if pm == nil {
		return nil, "", fmt.Errorf("%w: no message", ErrBadEnvelope)
	}
	m := &Message{Data: pm.Data, Attributes: pm.Attributes, ID: pm.MessageID}
	if m.ID == "" {
		m.ID = pm.MessageIDSnake
	}
	if m.ID == "" {
		return nil, "", fmt.Errorf("%w: no message id", ErrBadEnvelope)
	}
	switch {
	case pm.PublishTime != nil:
		m.PublishTime = *pm.PublishTime
	case pm.PublishTimeSnake != nil:
		m.PublishTime = *pm.PublishTimeSnake
	}
	if env.DeliveryAttempt != nil {
		m.DeliveryAttempt = *env.DeliveryAttempt
	}
	return m, env.Subscription, nil
}

// readErr classifies an error met while reading an envelope: too large, or not an envelope.
func readErr(err error) error {
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return fmt.Errorf("%w: more than %d bytes", errTooLarge, mbe.Limit)
	}
	return fmt.Errorf("%w: %w", ErrBadEnvelope, err)
}

// pushStatus maps a decoding error to its HTTP status.
func pushStatus(err error) int {
	if errors.Is(err, errTooLarge) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// writeProblem answers with an RFC 9457 problem document, as every genbox service does.
func writeProblem(w http.ResponseWriter, code int, detail string) {
	httpapi.JSON(w, code, task.ProblemContentType, httpapi.StatusProblem(code, detail))
}
