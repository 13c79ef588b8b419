package bus

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// Topics lists every topic of docs/architecture.md §1.
var Topics = []string{TopicTasks, TopicResults, TopicTasksDLQ, TopicResultsDLQ, TopicAlerts}

// SubscriptionSpec describes one subscription: the topic it reads and, for subscriptions whose
// poison messages must not loop forever, the topic Pub/Sub dead-letters them to.
type SubscriptionSpec struct {
	Name            string
	Topic           string
	DeadLetterTopic string // empty: no dead-letter policy
}

// Subscriptions lists every subscription of docs/architecture.md §1. Bootstrap, `genbox dev` and the Terraform
// test all read this one list. The dlqnotifier's subscriptions have no dead-letter policy: there
// is nowhere further to send what the last consumer cannot take.
var Subscriptions = []SubscriptionSpec{
	{Name: SubWorker, Topic: TopicTasks, DeadLetterTopic: TopicTasksDLQ},
	{Name: SubResults, Topic: TopicResults, DeadLetterTopic: TopicResultsDLQ},
	{Name: SubTasksDLQ, Topic: TopicTasksDLQ},
	{Name: SubResultsDLQ, Topic: TopicResultsDLQ},
	{Name: SubAlerts, Topic: TopicAlerts},
}

// Topology holds the subscription settings Bootstrap applies to every subscription.
type Topology struct {
	// AckDeadline is the initial ack deadline (10 s .. 600 s); pull consumers extend it while
	// their handler runs.
	AckDeadline time.Duration
	// MaxDeliveryAttempts is the dead-letter policy's limit (5 .. 100).
	MaxDeliveryAttempts int
	// MinBackoff and MaxBackoff bound the redelivery delay after a nack (0 .. 600 s).
	MinBackoff, MaxBackoff time.Duration
	// PushEndpoints maps a subscription name to the URL Pub/Sub pushes to; a subscription not
	// named here is a pull subscription.
	PushEndpoints map[string]string
}

// DefaultTopology returns the production settings: a minute to ack before lease extension
// matters, ten deliveries before a poison message is dead-lettered, 10 s .. 10 min backoff.
func DefaultTopology() Topology {
	return Topology{
		AckDeadline:         60 * time.Second,
		MaxDeliveryAttempts: 10,
		MinBackoff:          10 * time.Second,
		MaxBackoff:          600 * time.Second,
	}
}

// ErrTopology means a Topology holds values Pub/Sub would refuse.
var ErrTopology = errors.New("bus: invalid topology")

// Validate checks t against Pub/Sub's limits.
func (t Topology) Validate() error {
	var errs []error
	if t.AckDeadline < 10*time.Second || t.AckDeadline > 600*time.Second {
		errs = append(errs, fmt.Errorf("%w: AckDeadline %s not in 10s..600s", ErrTopology, t.AckDeadline))
	}
	if t.MaxDeliveryAttempts < 5 || t.MaxDeliveryAttempts > 100 {
		errs = append(errs, fmt.Errorf("%w: MaxDeliveryAttempts %d not in 5..100", ErrTopology, t.MaxDeliveryAttempts))
	}
	if t.MinBackoff < 0 || t.MaxBackoff > 600*time.Second || t.MinBackoff > t.MaxBackoff {
		errs = append(errs, fmt.Errorf("%w: backoff %s..%s not within 0s..600s", ErrTopology, t.MinBackoff, t.MaxBackoff))
	}
	known := make(map[string]bool, len(Subscriptions))
	for _, s := range Subscriptions {
		known[s.Name] = true
	}
	names := make([]string, 0, len(t.PushEndpoints))
	for name := range t.PushEndpoints {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !known[name] {
			errs = append(errs, fmt.Errorf("%w: push endpoint for unknown subscription %q", ErrTopology, name))
		}
	}
	return errors.Join(errs...)
}

// Bootstrap creates every topic and subscription of docs/architecture.md §1 in c's project, and brings
// subscriptions that already exist to t's settings. Running it again changes nothing.
func Bootstrap(ctx context.Context, c *pubsub.Client, t Topology) error {
	if err := t.Validate(); err != nil {
		return err
	}
	project := "projects/" + c.Project()
	for _, name := range Topics {
		_, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: project + "/topics/" + name})
		if err != nil && status.Code(err) != codes.AlreadyExists {
			return fmt.Errorf("create topic %s: %w", name, err)
		}
	}
	for _, spec := range Subscriptions {
		sub := t.subscription(project, spec)
		_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, sub)
		if status.Code(err) == codes.AlreadyExists {
			_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
				Subscription: sub,
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{
					"ack_deadline_seconds", "retry_policy", "dead_letter_policy", "push_config",
				}},
			})
		}
		if err != nil {
			return fmt.Errorf("create subscription %s: %w", spec.Name, err)
		}
	}
	return nil
}

// subscription is the full resource Bootstrap wants for spec.
func (t Topology) subscription(project string, spec SubscriptionSpec) *pubsubpb.Subscription {
	sub := &pubsubpb.Subscription{
		Name:               project + "/subscriptions/" + spec.Name,
		Topic:              project + "/topics/" + spec.Topic,
		AckDeadlineSeconds: int32(t.AckDeadline / time.Second),
		RetryPolicy: &pubsubpb.RetryPolicy{
			MinimumBackoff: durationpb.New(t.MinBackoff),
			MaximumBackoff: durationpb.New(t.MaxBackoff),
		},
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: t.PushEndpoints[spec.Name]},
	}
	if spec.DeadLetterTopic != "" {
		sub.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{
			DeadLetterTopic:     project + "/topics/" + spec.DeadLetterTopic,
			MaxDeliveryAttempts: int32(t.MaxDeliveryAttempts),
		}
	}
	return sub
}
