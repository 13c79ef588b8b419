package gemini_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// admissions records every Admit of a request: the worst case asked and what the call used.
type admissions struct {
	mu     sync.Mutex
	asked  []int64
	used   []int64
	refuse error
}

func (a *admissions) admit(_ context.Context, tokens int64) (func(int64), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refuse != nil {
		return nil, a.refuse
	}
	a.asked = append(a.asked, tokens)
	return func(used int64) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.used = append(a.used, used)
	}, nil
}

// Every model call of a Generate — a retry too — is admitted before it is made, at its worst
// case, and told what it used: nothing for a call answered with an error.
func TestAdmitEveryCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.srv.FailNext(primary, 503)
	var a admissions
	req := request("admit")
	req.Admit = a.admit
	res, err := b.client.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	worst, _ := b.client.Estimate(req)
	if diff := cmp.Diff([]int64{worst, worst}, a.asked); diff != "" {
		t.Errorf("admitted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{0, res.Usage.TotalTokens}, a.used); diff != "" {
		t.Errorf("used (-want +got):\n%s", diff)
	}
	if res.Calls != 2 {
		t.Errorf("%d calls, want 2", res.Calls)
	}
}

// A call Admit refuses is not made: Generate ends with Admit's error.
func TestAdmitRefusedMakesNoCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	a := admissions{refuse: context.Canceled}
	req := request("refused")
	req.Admit = a.admit
	if _, err := b.client.Generate(context.Background(), req); !errors.Is(err, context.Canceled) {
		t.Fatalf("Generate: %v, want Admit's error", err)
	}
	if calls := b.srv.Ledger().Total.Calls; calls != 0 {
		t.Fatalf("%d calls, want none", calls)
	}
}
