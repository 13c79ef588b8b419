package worker

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The commit that ends a task reserves its delivery for the nudge it publishes. When nobody
// carries that nudge — the worker died after its commit, Pub/Sub handed it to a resulthandler
// that died before its POST — the reservation is a lease without a holder: the sweeper leaves the
// delivery to it while it lasts, and once it has run out (one delivery lease, three webhook
// timeouts) the next pass nudges the delivery and the resulthandler POSTs it.
func TestAbandonedReservationDeliveredWithinALease(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx := context.Background()
	clock := testenv.NewClock(time.Now().UTC().Truncate(time.Microsecond))
	b.store.Now = clock.Now
	recv := doubles.NewReceiver(t, testenv.Tenant(t, b.store, "tenant-a"))
	b.task(t, "abandoned", func(d *protocol.Task) { d.CallbackURL = recv.URL() })
	rp := resulthandler.Policy{Owner: "rh", Timeout: 2 * time.Second, Horizon: time.Hour,
		BackoffMin: time.Second, BackoffMax: time.Minute, NoticeGrace: time.Minute, LogEntries: 20}
	pol := policy("w1")
	pol.DeliveryLease = rp.LeaseTTL()
	b.handler(pol, chain("m")).Handle(ctx, msg("abandoned"))
	ended := b.get(t, "abandoned")
	if ended.State != task.StateSucceeded || ended.ReservedDelivery(clock.Now()) == 0 || len(b.pub.On(bus.TopicResults)) != 1 {
		t.Fatalf("task %s, reservation %+v, %d result nudges: want succeeded with its delivery reserved for its one nudge",
			ended.State, ended.Delivery.Lease, len(b.pub.On(bus.TopicResults)))
	}

	nudges := &testenv.Publisher{} // the sweeper's; the worker's nudge in b.pub is never handed on
	sw := sweeper.New(b.store, nudges, nil, slog.New(slog.DiscardHandler), sweeper.Config{Interval: time.Second, Limit: 100,
		Pace: 1000, ReleaseRate: 1000, LeaderTTL: 2 * time.Second, BackoffBase: time.Minute, BackoffMax: time.Hour}, "sw")
	client := ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true, Timeout: rp.Timeout})
	rh, err := resulthandler.New(b.store, b.store, &testenv.Publisher{}, client, slog.New(slog.DiscardHandler), rp)
	if err != nil {
		t.Fatal(err)
	}
	// pass runs a sweep at the given time since the task ended, hands its result nudges to the
	// resulthandler, and returns how many there were.
	pass := func(at time.Duration) int {
		t.Helper()
		clock.Set(ended.CompletedAt.Add(at))
		if _, err := sw.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		found := nudges.Take()
		for _, m := range found {
			if m.Topic == bus.TopicResults {
				rh.Handle(ctx, &bus.Message{ID: "sweep", Attributes: m.Attrs})
			}
		}
		return len(found)
	}

	if n := pass(rp.LeaseTTL() - time.Millisecond); n != 0 {
		t.Errorf("%d nudges while the reservation lasts, want none: it may still be carried", n)
	}
	if n := pass(rp.LeaseTTL()); n != 1 {
		t.Errorf("%d nudges once the reservation ran out, want the delivery's", n)
	}
	if hooks := recv.Hooks(); len(hooks) != 1 || hooks[0].ID != task.EventID("abandoned", task.EventSucceeded, 0) {
		t.Errorf("webhooks %+v one delivery lease after the task ended, want its task.succeeded once", hooks)
	}
	if got := b.get(t, "abandoned").Delivery; got.State != task.DeliveryDelivered {
		t.Errorf("delivery %s, want delivered", got.State)
	}
}
