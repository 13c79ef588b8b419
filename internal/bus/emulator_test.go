package bus_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// fastTopology has the shortest settings Pub/Sub accepts, so redeliveries come at once.
func fastTopology() bus.Topology {
	return bus.Topology{AckDeadline: 10 * time.Second, MaxDeliveryAttempts: 5, MinBackoff: 0, MaxBackoff: time.Second}
}

func getSubscription(t *testing.T, c *pubsub.Client, name string) *pubsubpb.Subscription {
	t.Helper()
	s, err := c.SubscriptionAdminClient.GetSubscription(t.Context(), &pubsubpb.GetSubscriptionRequest{
		Subscription: "projects/" + c.Project() + "/subscriptions/" + name,
	})
	if err != nil {
		t.Fatalf("get subscription %s: %v", name, err)
	}
	return s
}

func TestBootstrapIdempotent(t *testing.T) {
	t.Parallel()
	c := testenv.PubSub(t, emulator.ProjectID(t))
	topo := bus.Topology{AckDeadline: 20 * time.Second, MaxDeliveryAttempts: 7, MinBackoff: time.Second, MaxBackoff: 30 * time.Second}
	for i := range 2 {
		if err := bus.Bootstrap(t.Context(), c, topo); err != nil {
			t.Fatalf("bootstrap #%d: %v", i+1, err)
		}
	}
	project := "projects/" + c.Project()
	for _, spec := range bus.Subscriptions {
		s := getSubscription(t, c, spec.Name)
		if got, want := s.GetTopic(), project+"/topics/"+spec.Topic; got != want {
			t.Errorf("%s: topic %q, want %q", spec.Name, got, want)
		}
		if got := s.GetAckDeadlineSeconds(); got != 20 {
			t.Errorf("%s: ack deadline %d s, want 20", spec.Name, got)
		}
		rp := s.GetRetryPolicy()
		if got, want := rp.GetMinimumBackoff().AsDuration(), time.Second; got != want {
			t.Errorf("%s: min backoff %s, want %s", spec.Name, got, want)
		}
		if got, want := rp.GetMaximumBackoff().AsDuration(), 30*time.Second; got != want {
			t.Errorf("%s: max backoff %s, want %s", spec.Name, got, want)
		}
		dlp := s.GetDeadLetterPolicy()
		switch {
		case spec.DeadLetterTopic == "" && dlp != nil:
			t.Errorf("%s: dead-letter policy %v, want none", spec.Name, dlp)
		case spec.DeadLetterTopic != "" && dlp.GetDeadLetterTopic() != project+"/topics/"+spec.DeadLetterTopic:
			t.Errorf("%s: dead-letter topic %q, want %s", spec.Name, dlp.GetDeadLetterTopic(), spec.DeadLetterTopic)
		case spec.DeadLetterTopic != "" && dlp.GetMaxDeliveryAttempts() != 7:
			t.Errorf("%s: max delivery attempts %d, want 7", spec.Name, dlp.GetMaxDeliveryAttempts())
		}
	}

	// A changed topology is applied to the subscriptions that already exist.
	topo.AckDeadline = 45 * time.Second
	topo.PushEndpoints = map[string]string{bus.SubResults: "http://127.0.0.1:1/push"}
	if err := bus.Bootstrap(t.Context(), c, topo); err != nil {
		t.Fatalf("bootstrap with new settings: %v", err)
	}
	s := getSubscription(t, c, bus.SubResults)
	if got := s.GetAckDeadlineSeconds(); got != 45 {
		t.Errorf("after update: ack deadline %d s, want 45", got)
	}
	if got := s.GetPushConfig().GetPushEndpoint(); got != "http://127.0.0.1:1/push" {
		t.Errorf("after update: push endpoint %q", got)
	}
}

// TestPullDeadLetters drives a message that is always nacked through Pull until Pub/Sub moves it
// to the dead-letter topic, and reads it there with Pub/Sub's dead-letter attributes.
func TestPullDeadLetters(t *testing.T) {
	t.Parallel()
	topo := fastTopology()
	c := testenv.Bus(t, emulator.ProjectID(t), topo)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()

	var mu sync.Mutex
	var attempts []int
	nacker := bus.HandlerFunc(func(_ context.Context, m *bus.Message) bus.Result {
		mu.Lock()
		attempts = append(attempts, m.DeliveryAttempt)
		mu.Unlock()
		return bus.Nack
	})
	dead := make(chan *bus.Message, 1)
	dlq := bus.HandlerFunc(func(_ context.Context, m *bus.Message) bus.Result {
		select {
		case dead <- m:
		default:
		}
		return bus.Ack
	})
	var wg sync.WaitGroup
	pull := func(sub string, h bus.Handler) {
		wg.Go(func() {
			if err := bus.Pull(ctx, c, sub, bus.PullSettings{NumGoroutines: 1, MaxOutstandingMessages: 10}, h); err != nil {
				t.Errorf("pull %s: %v", sub, err)
			}
		})
	}
	pull(bus.SubWorker, nacker)
	pull(bus.SubTasksDLQ, dlq)

	p := bus.NewPublisher(c)
	defer p.Close()
	_, err := p.Publish(ctx, bus.TopicTasks, []byte("poison"), map[string]string{"task_id": "t1"})
	if err != nil {
		t.Fatal(err)
	}

	var m *bus.Message
	select {
	case m = <-dead:
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("no dead letter after deliveries %v", attempts)
	}
	cancel()
	wg.Wait()

	if string(m.Data) != "poison" || m.Attributes["task_id"] != "t1" {
		t.Errorf("dead letter data %q attributes %v", m.Data, m.Attributes)
	}
	want := map[string]string{
		"CloudPubSubDeadLetterSourceDeliveryCount":       strconv.Itoa(topo.MaxDeliveryAttempts),
		"CloudPubSubDeadLetterSourceSubscription":        bus.SubWorker,
		"CloudPubSubDeadLetterSourceSubscriptionProject": c.Project(),
	}
	for k, v := range want {
		if got := m.Attributes[k]; got != v {
			t.Errorf("dead letter attribute %s = %q, want %q (all: %v)", k, got, v, m.Attributes)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, m.Attributes["CloudPubSubDeadLetterSourceTopicPublishTime"]); err != nil {
		t.Errorf("CloudPubSubDeadLetterSourceTopicPublishTime: %v (all: %v)", err, m.Attributes)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != topo.MaxDeliveryAttempts {
		t.Fatalf("handler saw delivery attempts %v, want %d deliveries", attempts, topo.MaxDeliveryAttempts)
	}
	for i, a := range attempts {
		if a != i+1 {
			t.Errorf("delivery %d had DeliveryAttempt %d (all %v)", i+1, a, attempts)
		}
	}
}

// TestPushDelivers has the emulator push to Push: the handler sees data and attributes, and a
// nack brings the message back.
func TestPushDelivers(t *testing.T) {
	t.Parallel()
	c := testenv.PubSub(t, emulator.ProjectID(t))
	got := make(chan *bus.Message, 10)
	var n int
	var mu sync.Mutex
	h := bus.HandlerFunc(func(_ context.Context, m *bus.Message) bus.Result {
		got <- m
		mu.Lock()
		defer mu.Unlock()
		n++
		if n == 1 {
			return bus.Nack
		}
		return bus.Ack
	})
	srv := httptest.NewServer(bus.Push(h, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	topo := fastTopology()
	topo.PushEndpoints = map[string]string{bus.SubResults: srv.URL + "/push"}
	if err := bus.Bootstrap(t.Context(), c, topo); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	p := bus.NewPublisher(c)
	defer p.Close()
	id, err := p.Publish(ctx, bus.TopicResults, []byte("nudge"), map[string]string{"task_id": "t2"})
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		select {
		case m := <-got:
			if m.ID != id || string(m.Data) != "nudge" || m.Attributes["task_id"] != "t2" {
				t.Errorf("delivery %d: id %q data %q attributes %v; want id %q", attempt, m.ID, m.Data, m.Attributes, id)
			}
			// The emulator leaves deliveryAttempt out of its push envelopes (Pub/Sub sends it on
			// subscriptions with a dead-letter policy); TestPushResults covers decoding it.
			if m.PublishTime.IsZero() {
				t.Errorf("delivery %d: no publish time", attempt)
			}
		case <-ctx.Done():
			t.Fatalf("delivery %d never came", attempt)
		}
	}
}
