package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// The service end to end, in both consumer modes: a nudge on gemini-results becomes a signed
// POST that the official library verifies; a 400 dead-letters the delivery with a notice on
// gemini-results-dlq; SIGTERM (ctx) shuts it down cleanly.
func TestRun(t *testing.T) {
	t.Parallel()
	testenv.EachConsumer(t, testRun, resulthandler.ConsumerPush, resulthandler.ConsumerPull)
}

func testRun(t *testing.T, mode string) { //nolint:thelper // the body of TestRun's subtests: a failure names its own line
	ctx := context.Background()
	top := bus.DefaultTopology()
	top.MinBackoff, top.MaxBackoff = time.Second, 2*time.Second
	p := testenv.NewProject(t, top)
	project, ps, st := p.ID, p.PubSub, p.Store
	recv := doubles.NewReceiver(t, testenv.Tenant(t, st, "acme"))
	recv.Schedule = func(n int) int { // t-ok's delivery is accepted, t-bad's refused
		if n == 1 {
			return http.StatusNoContent
		}
		return http.StatusBadRequest
	}

	env := map[string]string{
		"GOOGLE_CLOUD_PROJECT":            project,
		"PORT":                            "0",
		"GENBOX_CONSUMER":                 mode,
		"GENBOX_ALLOW_INSECURE_CALLBACKS": "true",
		"GENBOX_WEBHOOK_TIMEOUT":          "2s",
		"GENBOX_SHUTDOWN_GRACE":           "3s",
		"GENBOX_WEBHOOK_SECRETS_KEY":      testenv.SecretsKey,
		"GENBOX_UNAUTHENTICATED_PUSH":     "1", // the emulator pushes without a token
	}
	svc := testenv.Start(t, run, env)
	base := svc.Started(t, "resulthandler", 20*time.Second)
	if mode == resulthandler.ConsumerPush { // now that the port is known
		testenv.PushTo(t, ps, top, base+resulthandler.PushPath, bus.SubResults)
	}
	testenv.Ready(t, base, 30*time.Second)

	pub := bus.NewPublisher(ps)
	defer pub.Close()
	submit := func(id string) {
		now := time.Now()
		tk := &protocol.Task{ID: id, Tenant: "acme", Family: "summarize", Input: "x", CallbackURL: recv.URL(),
			State: task.StateRunning, CreatedAt: now}
		tk.Output, tk.OutputAt = "out", &now
		tk.Finish(task.StateSucceeded, now)
		if err := st.CreateTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(ctx, bus.TopicResults, nil, map[string]string{task.AttrTaskID: id}); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(id string) {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		want := task.EventID(id, task.EventSucceeded, 0)
		h, err := recv.Wait(wctx, func(h doubles.Hook) bool { return h.ID == want })
		if err != nil {
			t.Fatalf("no delivery of %s\n%s", id, svc.Log.String())
		}
		if h.VerifyErr != nil {
			t.Fatalf("delivery of %s does not verify: %v", id, h.VerifyErr)
		}
	}
	submit("t-ok")
	wait("t-ok")
	submit("t-bad")
	wait("t-bad")

	// The DLQ notice reaches gemini-results-dlq.
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	defer ncancel()
	var notice map[string]string
	err := ps.Subscriber(bus.SubResultsDLQ).Receive(nctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		notice = m.Attributes
		ncancel()
	})
	if err != nil || notice[task.AttrTaskID] != "t-bad" || notice[task.AttrKind] != "notice" || notice[task.AttrStage] != "delivery" {
		t.Fatalf("notice %v (%v)", notice, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ok, err := st.GetTask(ctx, "t-ok")
		if err != nil {
			t.Fatal(err)
		}
		if ok.Delivery.State == task.DeliveryDelivered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("t-ok delivery %+v", ok.Delivery)
		}
	}
	svc.StopClean(t)
}

func TestRunConfigError(t *testing.T) {
	t.Parallel()
	err := run(testenv.Ended(), func(k string) string {
		return map[string]string{"GENBOX_CONSUMER": "poll"}[k]
	}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "GENBOX_CONSUMER") {
		t.Fatalf("run answered %v, want an error naming GENBOX_CONSUMER", err)
	}
}
