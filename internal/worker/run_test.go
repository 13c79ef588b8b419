package worker

import (
	"context"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

// A run gives back what its call holds — the model-call slot, its place among the claimed and
// its budget hold, settled with what the call spent — at its first callOver, and nothing more at
// the next: an outcome's write, the call's end and execute's deferred call may each come first.
func TestCallOverGivesTheCallBackOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	budgets := quota.NewBudgets(spentFunc(func(string) {}), time.Now, time.Minute)
	h := New(nil, nil, nil, nil, nil, Policy{}, WithCapacity(1, 0, 2))
	p, _ := h.room.enter(ctx, false)
	if !p.startCall(ctx) {
		t.Fatal("no model-call slot free")
	}
	hold, err := budgets.Reserve(ctx, "acme", 1, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	r := &run{h: h, place: p, ticket: &ticket{hold: hold}, res: gemini.Result{CostUSD: 0.25}}
	r.callOver()
	r.callOver()
	if got := h.Load(); got.Calling != 0 || got.Served != 1 {
		t.Errorf("after the call: %+v, want no call slot held and one call served", got)
	}
	next, ok := h.room.enter(ctx, false)
	if !ok {
		t.Fatal("the next task found no place among the claimed: the run still holds its own")
	}
	defer next.leave()
	defer p.leave()
	// $0.25 spent of $1: $0.70 more fits, as it would not with the $0.50 still held or counted twice.
	if _, err := budgets.Reserve(ctx, "acme", 1, 0.7); err != nil {
		t.Errorf("reserve after the call: %v; want the hold settled once, at what the call spent", err)
	}
}
