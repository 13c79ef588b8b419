package bus

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/pubsub/v2"
)

// PullSettings configure streaming pull. Zero values take the client library's defaults.
type PullSettings struct {
	// NumGoroutines is the number of streaming pull streams.
	NumGoroutines int
	// MaxOutstandingMessages bounds the messages being handled at once.
	MaxOutstandingMessages int
	// MaxExtension is how long the library keeps extending a message's ack deadline while its
	// handler runs: size it to the longest handling (a whole generation for the worker).
	MaxExtension time.Duration
	// MaxDurationPerAckExtension and MinDurationPerAckExtension bound each extension.
	MaxDurationPerAckExtension, MinDurationPerAckExtension time.Duration
}

// Pull receives messages of subscription by streaming pull and hands each to h, acking or
// nacking by its result. The handler runs inside a consumer span ("process <subscription>") that
// continues the trace found in the message's attributes. Pull blocks until ctx ends (then it returns nil, after in-flight handlers return)
// or the subscription fails.
func Pull(ctx context.Context, c *pubsub.Client, subscription string, s PullSettings, h Handler) error {
	sub := c.Subscriber(subscription)
	sub.ReceiveSettings.NumGoroutines = s.NumGoroutines
	sub.ReceiveSettings.MaxOutstandingMessages = s.MaxOutstandingMessages
	sub.ReceiveSettings.MaxExtension = s.MaxExtension
	sub.ReceiveSettings.MaxDurationPerAckExtension = s.MaxDurationPerAckExtension
	sub.ReceiveSettings.MinDurationPerAckExtension = s.MinDurationPerAckExtension
	err := sub.Receive(ctx, func(ctx context.Context, pm *pubsub.Message) {
		m := &Message{ID: pm.ID, Data: pm.Data, Attributes: pm.Attributes, PublishTime: pm.PublishTime}
		if pm.DeliveryAttempt != nil {
			m.DeliveryAttempt = *pm.DeliveryAttempt
		}
		if process(ctx, h, subscription, m) == Ack {
			pm.Ack()
		} else {
			pm.Nack()
		}
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("pull %s: %w", subscription, err)
	}
	return nil
}
