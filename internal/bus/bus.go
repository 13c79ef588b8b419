// Package bus is genbox's one Pub/Sub abstraction: the topic and subscription names of the
// system, their idempotent bootstrap (for `genbox dev` and tests; production uses Terraform), a
// publisher that carries trace context in message attributes, and the consumer side — a Handler
// that returns Ack or Nack, driven either by streaming pull (Pull) or by push (Push).
//
// A message is only a nudge: handlers decide from Firestore, ack what they cannot act on and
// schedule retries in Firestore. Nack and Pub/Sub's dead-letter policy are the backstop for poison
// messages only.
package bus

import (
	"context"
	"time"
)

// Topics of docs/architecture.md §1.
const (
	TopicTasks      = "gemini-tasks"
	TopicResults    = "gemini-results"
	TopicTasksDLQ   = "gemini-tasks-dlq"
	TopicResultsDLQ = "gemini-results-dlq"
	TopicAlerts     = "genbox-alerts"
)

// Subscriptions of docs/architecture.md §1: one per consuming service and topic.
const (
	SubWorker     = "gemini-tasks-worker"
	SubResults    = "gemini-results-resulthandler"
	SubTasksDLQ   = "gemini-tasks-dlq-dlqnotifier"
	SubResultsDLQ = "gemini-results-dlq-dlqnotifier"
	SubAlerts     = "genbox-alerts-dlqnotifier"
)

// Message is a received Pub/Sub message, whichever way it arrived.
type Message struct {
	ID         string
	Data       []byte
	Attributes map[string]string
	// DeliveryAttempt counts deliveries, starting at 1. Pub/Sub sets it only on subscriptions
	// with a dead-letter policy; it is 0 otherwise.
	DeliveryAttempt int
	PublishTime     time.Time
}

// Result is a handler's verdict on a message.
type Result int

const (
	// Ack removes the message from its subscription.
	Ack Result = iota
	// Nack asks for redelivery after the subscription's retry backoff; after the dead-letter
	// policy's MaxDeliveryAttempts the message goes to the dead-letter topic.
	Nack
)

// String names the result for logs.
func (r Result) String() string {
	switch r {
	case Ack:
		return "ack"
	case Nack:
		return "nack"
	}
	return "unknown"
}

// Handler handles one message. It must be safe for concurrent use: Pull and Push call it from
// many goroutines.
type Handler interface {
	Handle(ctx context.Context, m *Message) Result
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, m *Message) Result

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *Message) Result { return f(ctx, m) }

var _ Handler = HandlerFunc(nil)
