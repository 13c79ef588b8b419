package console_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

var succeededTile = regexp.MustCompile(`data-state="succeeded">(\d+)<`)

// The overview counts what ran and the spend page prices it per model: two tasks that succeed
// appear as two succeeded tasks finished in the last hour, and their summed cost under the model
// that served them.
func TestOverviewAndSpendShowWhatRan(t *testing.T) {
	t.Parallel()
	s := devstack.StartTest(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := client.New(s.Info.Publisher, s.Info.APIKey)
	var cost float64
	model := ""
	for i := range 2 {
		res, err := api.Submit(ctx, task.Request{Family: "summarize", Input: fmt.Sprintf("overview task %d", i)})
		if err != nil {
			t.Fatal(err)
		}
		v, err := api.Wait(ctx, res.TaskID, 100*time.Millisecond)
		if err != nil || v.State != task.StateSucceeded || v.CostUSD <= 0 {
			t.Fatalf("task %d: %+v %v, want it succeeded and priced", i, v, err)
		}
		cost += v.CostUSD
		if model != "" && v.Model != model {
			t.Fatalf("two tasks of one family served by %s and %s", model, v.Model)
		}
		model = v.Model
	}
	c := browser(t)
	login(t, c, s.Info.Console)

	code, body := get(t, c, s.Info.DLQ+"/console/")
	if code != 200 {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	if m := succeededTile.FindStringSubmatch(body); m == nil || m[1] != "2" {
		t.Errorf("overview's succeeded tile %v, want 2:\n%s", m, body)
	}
	if !strings.Contains(body, "<p>2 tasks finished;") {
		t.Errorf("overview's last hour does not count the 2 finished tasks:\n%s", body)
	}
	// The dev tenant is capped (concurrency 10): its two tasks took a slot each and gave it back.
	slots := fmt.Sprintf(`<tr data-tenant="%s"><td>%s</td><td>0 / %d</td><td>0%%</td><td>0</td><td>1</td><td>0%%</td></tr>`,
		devstack.DevTenant, devstack.DevTenant, store.DefaultLimits().Concurrency)
	if !strings.Contains(body, slots) {
		t.Errorf("overview lacks the dev tenant's slots row %s:\n%s", slots, body)
	}

	code, body = get(t, c, s.Info.DLQ+"/console/spend")
	if code != 200 {
		t.Fatalf("spend: %d\n%s", code, body)
	}
	bar := regexp.MustCompile(`<th scope="row">` + regexp.QuoteMeta(model) + `</th>.*?<td>\$([0-9.]+)</td>`).FindStringSubmatch(body)
	if bar == nil {
		t.Fatalf("spend page has no bar for %s:\n%s", model, body)
	}
	if got, _ := strconv.ParseFloat(bar[1], 64); fmt.Sprintf("%.6f", got) != fmt.Sprintf("%.6f", cost) {
		t.Errorf("spend page prices %s at $%s, want the tasks' summed $%.6f", model, bar[1], cost)
	}
}
