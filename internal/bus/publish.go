package bus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel/propagation"
)

// Publisher publishes to any topic of its client's project, keeping one batching
// *pubsub.Publisher per topic. It is safe for concurrent use.
type Publisher struct {
	c *pubsub.Client

	mu     sync.Mutex
	topics map[string]*pubsub.Publisher
	closed bool
}

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("bus: publisher closed")

// NewPublisher returns a Publisher on c. Close it to flush and stop its topics.
func NewPublisher(c *pubsub.Client) *Publisher {
	return &Publisher{c: c, topics: make(map[string]*pubsub.Publisher)}
}

// Publish sends data with attrs to topic and waits for the server's message id, so a nil error
// means Pub/Sub has the message. A producer span ("publish <topic>") child of ctx's span covers
// the publish, and its trace context travels in the message's attributes (W3C
// traceparent/tracestate only, see messageTrace); attrs itself is not modified.
func (p *Publisher) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error) {
	t, err := p.topic(topic)
	if err != nil {
		return "", err
	}
	ctx, span := startPublish(ctx, topic)
	a := make(map[string]string, len(attrs)+2)
	maps.Copy(a, attrs)
	messageTrace.Inject(ctx, propagation.MapCarrier(a))
	id, err := t.Publish(ctx, &pubsub.Message{Data: data, Attributes: a}).Get(ctx)
	endPublish(span, id, err)
	if err != nil {
		return "", fmt.Errorf("publish to %s: %w", topic, err)
	}
	return id, nil
}

// publishDelay is how long a message waits for others to share its publish request. Every
// genbox message is a nudge some task waits on, so the client library's 10 ms would be added
// twice to each task's path; under load, CountThreshold still fills the requests.
const publishDelay = time.Millisecond

func (p *Publisher) topic(name string) (*pubsub.Publisher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	t, ok := p.topics[name]
	if !ok {
		t = p.c.Publisher(name)
		t.PublishSettings.DelayThreshold = publishDelay
		p.topics[name] = t
	}
	return t, nil
}

// Close flushes and stops every topic publisher (pubsub.Publisher.Stop waits for outstanding
// messages and reports nothing: each Publish already returned its own error); later Publish
// calls fail with ErrClosed. It does not close the client.
func (p *Publisher) Close() error {
	p.mu.Lock()
	topics := p.topics
	p.topics = nil
	p.closed = true
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range topics {
		wg.Go(t.Stop)
	}
	wg.Wait()
	return nil
}
