package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/google/go-cmp/cmp"
)

// POST /v1/tasks:rerun: a dry run counts the caller's matching finished tasks and prices them
// from their recorded tokens; a re-run is idempotent by its id, scoped to the tenant, and a
// filter the API cannot run is a 400 naming the field.
func TestRerunRoutes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var ids []string
	for range 3 {
		ids = append(ids, e.submit(validRequest()).TaskID)
	}
	e.finish(ids[0], task.StateSucceeded)
	e.finish(ids[1], task.StateFailed)
	other := e.submit(task.Request{Family: "classify", Input: "x"}).TaskID
	e.finish(other, task.StateSucceeded)
	// ids[2] is still queued: running already, not re-run.
	unanswered := e.submit(task.Request{Family: "summarize", Input: "no model answered this one"}).TaskID
	if _, err := e.st.MutateTask(ctx, unanswered, func(t *protocol.Task, now time.Time) error {
		t.Finish(task.StateFailed, now)
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	pricing := gemini.DefaultPricing()
	price := pricing.Price("gemini-test").Cost(10, 20)
	r, err := testFamilies.Render("summarize", "", "no model answered this one", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, worst := pricing.Estimate((&protocol.Task{ID: unanswered, Tenant: e.tenant}).Request(r))
	tests := []struct {
		name   string
		filter task.RerunFilter
		count  int
		usd    float64
	}{
		{"every finished task", task.RerunFilter{}, 4, 3*price + worst},
		{"by family and label", task.RerunFilter{Family: "summarize", Labels: map[string]string{"app": "x"}}, 2, 2 * price},
		{"by state: one answered, one priced at its worst case", task.RerunFilter{State: task.StateFailed}, 2, price + worst},
		{"by label value", task.RerunFilter{Labels: map[string]string{"app": "y"}}, 0, 0},
		{"created after them", task.RerunFilter{CreatedAfter: new(time.Now().Add(time.Hour))}, 0, 0},
	}
	for _, tc := range tests {
		got, err := e.api.Rerun(ctx, task.RerunRequest{Filter: tc.filter, DryRun: true})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.Count != tc.count || math.Abs(got.EstimatedCostUSD-tc.usd) > 1e-12 || got.RerunID != "" {
			t.Errorf("%s: count %d, $%g, id %q; want %d tasks at $%g and no re-run", tc.name, got.Count, got.EstimatedCostUSD, got.RerunID, tc.count, tc.usd)
		}
	}

	body := mustJSON(t, task.RerunRequest{Filter: task.RerunFilter{Family: "summarize"}})
	code, h, b := e.do("POST", "/v1/tasks:rerun", e.key, body, map[string]string{task.HeaderIdempotencyKey: "k1"})
	var first task.Rerun
	if err := json.Unmarshal(b, &first); code != http.StatusCreated || err != nil || first.State != task.RerunRunning || first.Count != 3 {
		t.Fatalf("create: %d %s", code, b)
	}
	if h.Get("Location") != first.StatusURL || first.StatusURL != e.url+"/v1/reruns/"+first.RerunID {
		t.Errorf("Location %q, status_url %q", h.Get("Location"), first.StatusURL)
	}
	code, h, b = e.do("POST", "/v1/tasks:rerun", e.key, body, map[string]string{task.HeaderIdempotencyKey: "k1"})
	var again task.Rerun
	if err := json.Unmarshal(b, &again); code != http.StatusOK || err != nil || again.RerunID != first.RerunID || h.Get(task.HeaderReplayed) != "true" {
		t.Fatalf("the same key again: %d %s, want 200 with re-run %s", code, b, first.RerunID)
	}
	other2 := mustJSON(t, task.RerunRequest{Filter: task.RerunFilter{Family: "classify"}})
	code, h, b = e.do("POST", "/v1/tasks:rerun", e.key, other2, map[string]string{task.HeaderIdempotencyKey: "k1"})
	if p := problemOf(t, h, b); code != http.StatusUnprocessableEntity || !slices.Equal(fields(p), []string{"rerun_id"}) {
		t.Errorf("the key with another filter: %d %s", code, b)
	}
	got, err := e.api.GetRerun(ctx, first.RerunID)
	if err != nil || got.RerunID != first.RerunID || got.Progress == nil {
		t.Fatalf("get: %+v %v", got, err)
	}
	_, key2 := e.newTenant("globex", nil)
	if _, err := client.New(e.url, key2, client.WithRetries(0)).GetRerun(ctx, first.RerunID); !isStatus(err, http.StatusNotFound) {
		t.Errorf("another tenant's get: %v, want 404", err)
	}

	for _, tc := range []struct {
		body  string
		field string
	}{
		{`{"filter": {"state": "queued"}}`, "filter.state"},
		{`{"filter": {"created_after": "2026-01-02T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"}}`, "filter.created_after"},
		{`{"filter": {}, "rerun_id": "no spaces"}`, "rerun_id"},
	} {
		code, h, b := e.do("POST", "/v1/tasks:rerun", e.key, []byte(tc.body), nil)
		if p := problemOf(t, h, b); code != http.StatusBadRequest || !cmp.Equal(fields(p), []string{tc.field}) {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.body, code, b, tc.field)
		}
	}
}

func isStatus(err error, code int) bool {
	var p *task.Problem
	return errors.As(err, &p) && p.Status == code
}
