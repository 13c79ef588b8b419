package worker

import (
	"context"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// A task offered while the instance consumes is run here as its message would be; an offer
// before or after that, or beyond the handler's capacity, is refused (the sweeper then publishes
// it), and Run returns once what it took has finished.
func TestLocalRunsWhatItTakes(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	gate := b.srv.Block("m")
	defer gate.Release()
	b.task(t, "a")
	b.task(t, "b")
	l := NewLocal(New(b.store, b.gen, chain("m"), b.pub, b.log, policy("w"), WithCapacity(1, 0, 1)))
	if l.Offer("a") {
		t.Fatal("an offer before Run was taken")
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); l.Run(ctx) }()
	waitFor(t, "Run to accept offers", 10*time.Second, func() bool { return l.Offer("a") })
	select {
	case <-gate.Entered():
	case <-time.After(30 * time.Second):
		t.Fatal("the task taken never called the model")
	}
	if l.Offer("b") {
		t.Error("an offer beyond the handler's capacity was taken")
	}
	stop()
	if l.Offer("b") {
		t.Error("an offer after Run's context ended was taken")
	}
	select {
	case <-ran:
		t.Fatal("Run returned while the task it took was still running")
	case <-time.After(200 * time.Millisecond):
	}
	gate.Release()
	<-ran
	if got := b.get(t, "a"); got.State != task.StateSucceeded {
		t.Errorf("the task taken is %s, want succeeded", got.State)
	}
}
