package dlqnotifier

import (
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// tenantAPI serves the publisher over the test's store and returns a client of the test tenant.
func (e *env) tenantAPI(t *testing.T) *client.Client {
	t.Helper()
	testenv.Tenant(t, e.st, testTenant)
	const key = "tenant-key-0123456789abcdef0123456789"
	if _, err := e.st.CreateAPIKey(e.ctx, testTenant, key); err != nil {
		t.Fatal(err)
	}
	families, err := prompts.Default()
	if err != nil {
		t.Fatal(err)
	}
	cfg := publisher.DefaultConfig()
	cfg.ProjectID, cfg.AdminKey, cfg.SecretsKey = "p", testAdminKey+"-publisher", testenv.SecretsKey
	srv, err := publisher.New(cfg, publisher.Deps{Store: e.st, Publisher: e.pub, Families: families, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return client.New(hs.URL, key, client.WithRetries(0))
}

// A tenant erases tasks whose webhooks died in a flood (its receiver answered 404): DELETE
// discards each one's open delivery dead letter, recorded as the tenant's erase, and erases the
// task, which gets its TTL. The sweeper's slack_update then takes the buttons off the message of
// the one posted on its own; a click on them changes nothing; the flood keeps its count and
// its message, and the dead letter the tenant left alone stays open. Before, the DELETE
// answered 409 and, the flood never being paged task by task, the data was kept forever.
func TestEraseDiscardsDeadDeliveriesOfAFlood(t *testing.T) {
	t.Parallel()
	e := setup(t)
	api := e.tenantAPI(t)
	var ids, dls []string
	for i := range 3 {
		tk := e.refusedDelivery(t, fmt.Sprintf("%032x", 0xe2a5ed00+i), 404) // ids as the publisher makes them
		e.svc.Handle(e.ctx, noticeMsg(tk.ID, tk.Notices[0]))
		ids, dls = append(ids, tk.ID), append(dls, tk.Notices[0].DeadLetterID(tk.ID))
	}
	flood := e.flood(t, "http-404")
	posts := e.slack.Posts()
	if flood.Count != 2 || flood.Shown != 2 || len(posts) != 2 {
		t.Fatalf("flood counts %d, shows %d, %d posts; want the first posted, 2 in the flood's message", flood.Count, flood.Shown, len(posts))
	}
	first := e.deadLetter(t, dls[0])

	for _, id := range ids[:2] { // the one posted on its own, one counted in the flood
		if err := api.Delete(e.ctx, id); err != nil {
			t.Fatalf("delete %s: %v, want it erased", id, err)
		}
	}
	sw, sweeperPub := e.sweeper()
	if _, err := sw.Pass(e.ctx); err != nil {
		t.Fatal(err)
	}
	updates := 0
	for _, m := range sweeperPub.On(bus.TopicTasksDLQ) {
		if m.Attrs[task.AttrKind] == KindSlackUpdate {
			updates++
			e.svc.Handle(e.ctx, &bus.Message{ID: "u-" + m.Attrs[task.AttrTaskID], Attributes: m.Attrs})
		}
	}
	if updates != 2 {
		t.Errorf("the sweeper sent %d slack_update nudges, want one per erased task", updates)
	}

	for i, id := range ids[:2] {
		d := e.deadLetter(t, dls[i])
		if d.State != store.DeadLetterDiscarded || d.DecidedBy != store.ErasedBy(testTenant) {
			t.Errorf("dead letter %s is %s by %q, want discarded by %q", d.ID, d.State, d.DecidedBy, store.ErasedBy(testTenant))
		}
		tk := testenv.GetTask(t, e.st, id)
		if tk.ErasedAt == nil || tk.Output != "" || len(tk.OpenDeadLetters) != 0 || tk.SlackUpdate != nil || tk.ExpireAt == nil ||
			tk.Delivery.State != task.DeliveryDiscarded {
			t.Errorf("task %s: erased at %v, output %q, open %v, Slack update %+v, expire_at %v, delivery %s; want erased, closed, expiring, discarded",
				id, tk.ErasedAt, tk.Output, tk.OpenDeadLetters, tk.SlackUpdate, tk.ExpireAt, tk.Delivery.State)
		}
	}
	var shown bool
	for _, u := range e.slack.Calls("chat.update") {
		if u.Form.Get("ts") == first.SlackTS && strings.Contains(textOf(t, u), "Discarded") && strings.Contains(textOf(t, u), "tenant "+testTenant) && len(buttons(t, u)) == 0 {
			shown = true
		}
	}
	if !shown {
		t.Errorf("the message of %s (ts %s) was not updated to the tenant's discard, without buttons", dls[0], first.SlackTS)
	}
	e.approve(t, ActionRedeliver, dls[0]) // a click on the old message changes nothing
	if d := e.deadLetter(t, dls[0]); d.State != store.DeadLetterDiscarded {
		t.Errorf("a click on the erased task's old message moved its dead letter to %s", d.State)
	}
	if tk := testenv.GetTask(t, e.st, ids[0]); tk.Delivery.State != task.DeliveryDiscarded {
		t.Errorf("a click on the erased task's old message moved its delivery to %s", tk.Delivery.State)
	}

	if f := e.flood(t, "http-404"); f.Count != flood.Count || f.Shown != flood.Shown || f.SlackTS != flood.SlackTS {
		t.Errorf("flood counts %d, shows %d in %s after the erases; want %d, %d in %s as before", f.Count, f.Shown, f.SlackTS, flood.Count, flood.Shown, flood.SlackTS)
	}
	if n := len(e.slack.Posts()); n != len(posts) {
		t.Errorf("%d Slack posts after the erases, want %d: nothing new to page", n, len(posts))
	}
	open, err := e.st.OpenDeadLetters(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if open[task.StageDelivery] != 1 {
		t.Errorf("%d open delivery dead letters, want 1: the one the tenant did not erase", open[task.StageDelivery])
	}
}
