package gemini_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

func TestBatchRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	good, picky := request("good"), request("picky")
	picky.Validate = func(string) error { return errors.New("not what I wanted") }
	reqs := map[string]gemini.Request{good.TaskID: good, picky.TaskID: picky}
	job, err := b.client.CreateBatch(ctx, primary, "job-1", []gemini.Request{good, picky})
	if err != nil {
		t.Fatal(err)
	}
	if job.DisplayName != "job-1" || job.Name == "" {
		t.Fatalf("created %+v", job)
	}
	found, err := b.client.FindBatch(ctx, "job-1")
	if err != nil || found.Name != job.Name {
		t.Fatalf("FindBatch = %+v, %v; want %s", found, err, job.Name)
	}
	if _, err := b.client.FindBatch(ctx, "job-2"); !errors.Is(err, gemini.ErrBatchNotFound) {
		t.Errorf("FindBatch of an unknown name: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !job.Done() {
		if time.Now().After(deadline) {
			t.Fatalf("job still %s", job.State)
		}
		if job, err = b.client.GetBatch(ctx, job.Name, reqs); err != nil {
			t.Fatal(err)
		}
	}
	if job.State != gemini.BatchSucceeded || len(job.Results) != 2 {
		t.Fatalf("job %+v", job)
	}
	pricing := testConfig(t, b.srv).Pricing
	l := b.srv.Ledger()
	for i, r := range job.Results {
		if r.Key != []string{"good", "picky"}[i] || r.Result.Tier != gemini.TierBatch || r.Result.Calls != 1 {
			t.Errorf("result %d = %+v", i, r)
		}
		if want := l.Bills[i].CostUSD(pricing); want == 0 || math.Abs(r.Result.CostUSD-want) > 1e-15 {
			t.Errorf("result %d costs %g, the invoice %g", i, r.Result.CostUSD, want)
		}
	}
	if job.Results[0].Err != nil || job.Results[0].Result.Text == "" || gemini.ClassOf(job.Results[1].Err) != gemini.Quality {
		t.Errorf("results %+v, want the good one answered and the picky one a quality failure", job.Results)
	}
	b.srv.FailBatchDeletesNext(http.StatusServiceUnavailable)
	if err := b.client.DeleteBatch(ctx, job.Name); err == nil {
		t.Fatal("a delete the fake was to fail succeeded")
	}
	if _, err := b.client.GetBatch(ctx, job.Name, nil); err != nil {
		t.Fatalf("GetBatch after a failed delete: %v, want the job still there", err)
	}
	if err := b.client.DeleteBatch(ctx, job.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.GetBatch(ctx, job.Name, nil); !errors.Is(err, gemini.ErrBatchNotFound) {
		t.Errorf("GetBatch after delete: %v", err)
	}
	if err := b.client.DeleteBatch(ctx, job.Name); !errors.Is(err, gemini.ErrBatchNotFound) {
		t.Errorf("DeleteBatch of a deleted job: %v, want ErrBatchNotFound", err)
	}
	if got := b.srv.Ledger().BatchesNamed("job-1"); len(got) != 1 || !got[0].Deleted {
		t.Errorf("the ledger's job-1 %+v, want one, deleted", got)
	}
	b.srv.SetBatchPlan(primary, geminitest.BatchPlan{Pending: time.Hour})
	held, err := b.client.CreateBatch(ctx, primary, "job-3", []gemini.Request{good})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.client.CancelBatch(ctx, held.Name); err != nil {
		t.Fatal(err)
	}
	if got, err := b.client.GetBatch(ctx, held.Name, nil); err != nil || got.State != gemini.BatchCancelled || len(got.Results) != 0 {
		t.Errorf("cancelled job %+v, %v", got, err)
	}
}

// Gemini refuses a batch of inlined requests over its size limit with a plain 400; CreateBatch
// tells it from other refusals (ErrBatchTooLarge), and BatchSize measures what a request adds,
// so that a caller can cap its jobs under the limit.
func TestBatchTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	reqs := []gemini.Request{request("a"), request("b"), request("c")}
	size := 0
	for _, r := range reqs {
		size += b.client.BatchSize(r)
	}
	b.srv.SetBatchByteLimit(size)
	_, err := b.client.CreateBatch(ctx, primary, "too-large", reqs)
	if !errors.Is(err, gemini.ErrBatchTooLarge) {
		t.Fatalf("a batch over the limit: %v, want ErrBatchTooLarge", err)
	}
	if _, err := b.client.CreateBatch(ctx, primary, "fits", reqs[:1]); err != nil {
		t.Fatalf("a batch of a third of the limit: %v", err)
	}
	b.srv.SetBatchByteLimit(0)
	_, err = b.client.CreateBatch(ctx, "", "no-model", reqs)
	if err == nil || errors.Is(err, gemini.ErrBatchTooLarge) {
		t.Errorf("a batch refused for another reason: %v, want an error other than ErrBatchTooLarge", err)
	}
}

func TestBatchMaxSpend(t *testing.T) {
	t.Parallel()
	p := gemini.Pricing{Prices: map[string]gemini.Price{"m": {InputPerM: 2, OutputPerM: 4, BatchInputPerM: 1, BatchOutputPerM: 2}}, DefaultMaxOutputTokens: 1000}
	req := gemini.Request{Prompt: "x"}
	_, standard := p.Estimate(gemini.Request{Prompt: "x", Models: []string{"m"}})
	if got := p.BatchMaxSpend(req, "m"); math.Abs(got-standard/2) > 1e-12 {
		t.Errorf("batch worst case $%g, want half the standard estimate $%g", got, standard/2)
	}
	req.MaxCostUSD = standard / 10
	if got := p.BatchMaxSpend(req, "m"); got != req.MaxCostUSD {
		t.Errorf("batch worst case $%g under max_cost_usd $%g, want the cap", got, req.MaxCostUSD)
	}
}
