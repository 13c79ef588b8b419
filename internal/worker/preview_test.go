package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A streamed task's call goes through streamGenerateContent: previews of the text so far are
// written to previews/{id} while it runs, each a prefix of the output, and the stored output and
// the webhook's payload are the committed answer. Its call is in the attempt log.
func TestStreamedTaskWritesPreviewsNotTheOutput(t *testing.T) {
	t.Parallel()
	b := setup(t, 900*time.Millisecond) // three chunks, 300 ms apart
	b.task(t, "streamed", func(d *protocol.Task) { d.Stream = true })
	pol := policy("w1")
	pol.PreviewEvery = 10 * time.Millisecond
	h := b.handler(pol, chain("m"))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var previews []string
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		for p, err := range b.store.WatchPreview(ctx, "streamed") {
			if err != nil {
				return
			}
			previews = append(previews, p.Text)
			if p.Epoch != 1 || p.Replay != 0 {
				t.Errorf("preview of epoch %d replay %d, want epoch 1 replay 0", p.Epoch, p.Replay)
			}
		}
	}()
	if r := h.Handle(context.Background(), msg("streamed")); r != bus.Ack {
		t.Fatalf("result %v", r)
	}
	got := b.get(t, "streamed")
	if got.State != task.StateSucceeded || got.Output == "" {
		t.Fatalf("task %s output %q, want succeeded with an output", got.State, got.Output)
	}
	time.Sleep(200 * time.Millisecond) // the listener's last snapshots
	cancel()
	<-watching
	if len(previews) < 2 {
		t.Fatalf("previews %q, want one per chunk at least for the first two", previews)
	}
	for _, p := range previews {
		if !strings.HasPrefix(got.Output, p) {
			t.Errorf("preview %q is not a prefix of the output %q", p, got.Output)
		}
	}
	if !strings.Contains(got.Delivery.Payload, got.Output) {
		t.Errorf("webhook payload %s does not carry the committed output", got.Delivery.Payload)
	}
	if billed := b.srv.Ledger().BilledFor("streamed"); got.Usage != billed {
		t.Errorf("recorded usage %+v, billed %+v", got.Usage, billed)
	}
	if len(got.AttemptLog) != 1 {
		t.Fatalf("attempt log %+v, want the one call", got.AttemptLog)
	}
	if a := got.AttemptLog[0]; a.Model != "m" || a.Epoch != 1 || a.Number != 1 || a.Class != "" || a.Usage != got.Usage || a.Latency < 800 {
		t.Errorf("attempt %+v: want model m, epoch 1, number 1, no failure, the task's usage, ≥ 800 ms", a)
	}
}

// A task without stream makes a plain call and writes no preview.
func TestUnstreamedTaskWritesNoPreview(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "plain")
	if r := b.handler(policy("w1"), chain("m")).Handle(context.Background(), msg("plain")); r != bus.Ack {
		t.Fatalf("result %v", r)
	}
	if got := b.get(t, "plain"); got.State != task.StateSucceeded {
		t.Fatalf("state %s", got.State)
	}
	if _, err := b.fs.Collection(store.PreviewsCollection).Doc("plain").Get(context.Background()); err == nil {
		t.Error("a preview was written for a task without stream")
	}
}
