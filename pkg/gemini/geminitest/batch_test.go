package geminitest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// inlined is an inlined request of prompt keyed by key, as a caller puts it in a batch.
func inlined(key, prompt string) *genai.InlinedRequest {
	return &genai.InlinedRequest{Contents: genai.Text(prompt), Metadata: map[string]string{"key": key},
		Config: &genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText("You summarize.", genai.RoleUser)}}
}

// waitBatch polls a job through the SDK until it is done, and returns it with every state seen.
func waitBatch(t *testing.T, b bundle, name string) (*genai.BatchJob, []genai.JobState) {
	t.Helper()
	var seen []genai.JobState
	deadline := time.Now().Add(10 * time.Second)
	for {
		job, err := b.client.Batches.Get(t.Context(), name, nil)
		if err != nil {
			t.Fatalf("Batches.Get(%s): %v", name, err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != job.State {
			seen = append(seen, job.State)
		}
		switch job.State {
		case genai.JobStateSucceeded, genai.JobStateFailed, genai.JobStateCancelled, genai.JobStateExpired:
			return job, seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s after 10s", name, job.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBatchRunsInlinedRequestsThroughTheSDK(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.SetBatchPlan(model, geminitest.BatchPlan{Pending: 30 * time.Millisecond, Running: 30 * time.Millisecond})
	ctx := t.Context()
	job, err := b.client.Batches.Create(ctx, model, &genai.BatchJobSource{InlinedRequests: []*genai.InlinedRequest{
		inlined("task-a", "summarize task-a"), inlined("task-b", "summarize task-b"),
	}}, &genai.CreateBatchJobConfig{DisplayName: "job-1"})
	if err != nil {
		t.Fatalf("Batches.Create: %v", err)
	}
	if job.State != genai.JobStatePending || job.DisplayName != "job-1" || !strings.HasPrefix(job.Name, "batches/") || job.Model != "models/"+model {
		t.Fatalf("created job = %+v, want pending batches/… job-1 of models/%s", job, model)
	}
	if l := b.srv.Ledger(); l.Total.Generations != 0 {
		t.Fatalf("billed %d generations before the job ran", l.Total.Generations)
	}
	done, seen := waitBatch(t, b, job.Name)
	order := []genai.JobState{genai.JobStatePending, genai.JobStateRunning, genai.JobStateSucceeded}
	for i, s := range seen {
		if j := slices.Index(order, s); j < 0 || i > 0 && j <= slices.Index(order, seen[i-1]) {
			t.Fatalf("states seen %v, want an ordered part of %v", seen, order)
		}
	}
	if done.Dest == nil || len(done.Dest.InlinedResponses) != 2 {
		t.Fatalf("succeeded job dest = %+v, want 2 inlined responses", done.Dest)
	}
	for i, key := range []string{"task-a", "task-b"} {
		r := done.Dest.InlinedResponses[i]
		if r.Metadata["key"] != key || r.Error != nil || r.Response == nil {
			t.Fatalf("response %d = %+v, want key %s answered", i, r, key)
		}
		online, err := b.generate(ctx, model, "summarize "+key, &genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText("You summarize.", genai.RoleUser)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Response.Text() != online.Text() {
			t.Errorf("batch answer %q, online answer %q: want the same answer for the same request", r.Response.Text(), online.Text())
		}
		if u := r.Response.UsageMetadata; u == nil || u.PromptTokenCount <= 0 || u.TrafficType != "" {
			t.Errorf("batch usage = %+v, want prompt tokens and no trafficType", u)
		}
	}
	l := b.srv.Ledger()
	var tiers []string
	for _, bill := range l.Bills {
		tiers = append(tiers, bill.Tier)
	}
	if diff := cmp.Diff([]string{geminitest.TierBatch, geminitest.TierBatch, geminitest.TierStandard, geminitest.TierStandard}, tiers); diff != "" {
		t.Errorf("billed tiers (-want +got):\n%s", diff)
	}
	if got := l.Model(model).Batched; got != 2 {
		t.Errorf("Batched = %d, want 2", got)
	}
	if got := l.BatchesNamed("job-1"); len(got) != 1 || got[0].State != geminitest.BatchSucceeded || got[0].Requests != 2 {
		t.Errorf("ledger batches named job-1 = %+v, want one succeeded job of 2 requests", got)
	}
}

func TestBatchListFindsJobsByDisplayNameAcrossPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.SetBatchPlan(model, geminitest.BatchPlan{Pending: time.Hour})
	ctx := t.Context()
	for i := range 23 {
		if _, err := b.client.Batches.Create(ctx, model, &genai.BatchJobSource{InlinedRequests: []*genai.InlinedRequest{inlined("k", "p")}},
			&genai.CreateBatchJobConfig{DisplayName: fmt.Sprintf("job-%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	for job, err := range b.client.Batches.All(ctx) {
		if err != nil {
			t.Fatalf("Batches.All: %v", err)
		}
		names = append(names, job.DisplayName)
	}
	if len(names) != 23 || names[0] != "job-22" || names[22] != "job-00" {
		t.Fatalf("listed %d jobs %v, want all 23 newest first", len(names), names)
	}
}

func TestBatchOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	create := func(name string) *genai.BatchJob {
		t.Helper()
		job, err := b.client.Batches.Create(ctx, model, &genai.BatchJobSource{InlinedRequests: []*genai.InlinedRequest{inlined("k", "p "+name)}},
			&genai.CreateBatchJobConfig{DisplayName: name})
		if err != nil {
			t.Fatal(err)
		}
		return job
	}
	b.srv.FailBatchesNext(model, geminitest.BatchFailed, geminitest.BatchExpired)
	for _, tc := range []struct {
		name string
		want genai.JobState
	}{{"fails", genai.JobStateFailed}, {"expires", genai.JobStateExpired}, {"succeeds", genai.JobStateSucceeded}} {
		got, _ := waitBatch(t, b, create(tc.name).Name)
		if got.State != tc.want {
			t.Errorf("job %s ended %s, want %s", tc.name, got.State, tc.want)
		}
		if tc.want != genai.JobStateSucceeded && got.Dest != nil && len(got.Dest.InlinedResponses) > 0 {
			t.Errorf("job %s has results %+v, want none", tc.name, got.Dest)
		}
	}
	b.srv.SetBatchPlan(model, geminitest.BatchPlan{Pending: time.Hour})
	held := create("cancelled")
	if err := b.client.Batches.Cancel(ctx, held.Name, nil); err != nil {
		t.Fatalf("Batches.Cancel: %v", err)
	}
	if got, _ := waitBatch(t, b, held.Name); got.State != genai.JobStateCancelled {
		t.Errorf("cancelled job is %s", got.State)
	}
	if err := b.client.Batches.Cancel(ctx, held.Name, nil); apiError(t, err).Code != http.StatusBadRequest {
		t.Errorf("second cancel: %v, want 400", err)
	}
	if _, err := b.client.Batches.Delete(ctx, held.Name, nil); err != nil {
		t.Fatalf("Batches.Delete: %v", err)
	}
	if _, err := b.client.Batches.Get(ctx, held.Name, nil); apiError(t, err).Code != http.StatusNotFound {
		t.Errorf("get after delete: %v, want 404", err)
	}
	if l := b.srv.Ledger(); l.Total.Generations != 1 || len(l.Bills) != 1 || !strings.Contains(l.Bills[0].Request.Prompt, "succeeds") {
		t.Errorf("ledger %+v, want only the succeeded job's request billed", l.Total)
	}
}

func TestBatchRequestFailsInsideAJob(t *testing.T) {
	t.Parallel()
	b := setup(t, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		if strings.Contains(r.Prompt, "bad") {
			return geminitest.Reply{Code: http.StatusTooManyRequests, Message: "Resource has been exhausted."}
		}
		return geminitest.DefaultReply(r)
	}))
	job, err := b.client.Batches.Create(t.Context(), model, &genai.BatchJobSource{InlinedRequests: []*genai.InlinedRequest{
		inlined("good", "a good one"), inlined("bad", "a bad one"),
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done, _ := waitBatch(t, b, job.Name)
	rs := done.Dest.InlinedResponses
	if rs[0].Error != nil || rs[0].Response == nil || rs[1].Response != nil || rs[1].Error == nil || *rs[1].Error.Code != http.StatusTooManyRequests || rs[1].Metadata["key"] != "bad" {
		t.Fatalf("responses %+v / %+v, want the good one answered and the bad one a 429 error keyed bad", rs[0], rs[1])
	}
	l := b.srv.Ledger()
	if l.Total.Generations != 1 || l.Total.Failed != 1 || l.BatchesNamed("")[0].Failed != 1 {
		t.Errorf("ledger %+v %+v, want one billed and one failed request", l.Total, l.Batches)
	}
}

// The API sends int64 fields as JSON strings; the SDK must read the job all the same.
func TestBatchInt64FieldsAreStrings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job, err := b.client.Batches.Create(t.Context(), model, &genai.BatchJobSource{InlinedRequests: []*genai.InlinedRequest{inlined("k", "p")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, b.srv.URL+"/v1beta/"+job.Name, nil)
	req.Header.Set("x-goog-api-key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var raw struct {
		Metadata struct {
			BatchStats map[string]any `json:"batchStats"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if got, ok := raw.Metadata.BatchStats["requestCount"].(string); !ok || got != "1" {
		t.Errorf("batchStats.requestCount = %#v in %s, want the string \"1\"", raw.Metadata.BatchStats["requestCount"], body)
	}
}
