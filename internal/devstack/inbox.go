package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// Delivery is one webhook the dev tenant's listener received and verified.
type Delivery struct {
	ID    string     // webhook-id
	Event task.Event // the decoded body
	Body  []byte
	At    time.Time
}

// Inbox is the dev tenant's webhook listener: pkg/webhook's Receiver (which verifies and prints
// every delivery) with every verified delivery also kept, so tests and scripts can wait for one.
type Inbox struct {
	recv http.Handler
	got  record[Delivery]
}

// NewInbox returns a listener verifying with secret and printing to out.
func NewInbox(secret string, out io.Writer) (*Inbox, error) {
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		return nil, err
	}
	return &Inbox{recv: webhook.Receiver(v, out)}, nil
}

var _ http.Handler = (*Inbox)(nil)

// statusRecorder remembers the status the Receiver answered.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// ServeHTTP hands the request to the Receiver and keeps it when the Receiver verified it.
func (in *Inbox) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, webhook.MaxBodyBytes))
	if err != nil {
		http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	in.recv.ServeHTTP(rec, r)
	if rec.status/100 != 2 {
		return
	}
	d := Delivery{ID: r.Header.Get(webhook.HeaderID), Body: body, At: time.Now()}
	_ = json.Unmarshal(body, &d.Event) // verified: genbox wrote it; a body that does not decode keeps a zero Event
	in.got.add(d)
}

// Deliveries returns every verified delivery so far, in arrival order.
func (in *Inbox) Deliveries() []Delivery { return in.got.all() }

// Wait returns the first delivery that match accepts, waiting for it until ctx ends.
func (in *Inbox) Wait(ctx context.Context, match func(Delivery) bool) (Delivery, error) {
	return in.got.wait(ctx, match)
}
