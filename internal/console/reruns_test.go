package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

// The console offers the API's re-run: the estimate of a tenant's filter first, then the
// re-run it showed, started once however often its form is sent, by the session's operator.
func TestRerunFromTheConsole(t *testing.T) {
	t.Parallel()
	s := devstack.StartTest(t, nil, "GENBOX_RERUN_INTERVAL", "100ms")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := client.New(s.Info.Publisher, s.Info.APIKey)
	var ids []string
	for _, in := range []string{"first", "second"} {
		v := s.SubmitWait(t, ctx, task.Request{Family: "summarize", Input: in, Labels: map[string]string{"app": "console"}})
		ids = append(ids, v.TaskID)
	}
	dry, err := api.Rerun(ctx, task.RerunRequest{Filter: task.RerunFilter{Labels: map[string]string{"app": "console"}}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}

	c := browser(t)
	csrf := login(t, c, s.Info.Console)
	code, body := get(t, c, s.Info.DLQ+"/console/reruns?tenant="+devstack.DevTenant+"&labels=app%3Dconsole")
	if code != http.StatusOK || !strings.Contains(body, "<strong>2</strong> tasks would run again, about <strong>$") ||
		!strings.Contains(body, "Re-run these 2 tasks (~$") {
		t.Fatalf("the estimate: %d\n%s", code, body)
	}
	if want := fmt.Sprintf("about <strong>$%.6f</strong>", dry.EstimatedCostUSD); !strings.Contains(body, want) {
		t.Errorf("the console's estimate is not the API's %s:\n%s", want, body)
	}
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(body, -1) {
		form.Set(m[1], m[2])
	}
	if form.Get("rerun_id") == "" || form.Get("labels") != "app=console" {
		t.Fatalf("the start form holds %v", form)
	}
	noCSRF := url.Values{}
	for k, v := range form {
		if k != "csrf" {
			noCSRF[k] = v
		}
	}
	if code, _ := post(t, c, s.Info.DLQ+"/console/reruns", noCSRF); code != http.StatusForbidden {
		t.Errorf("a start without the CSRF token: %d, want 403", code)
	}
	form.Set("csrf", csrf)
	for round, want := range []string{"started: 2 tasks", "nothing was repeated"} {
		code, h := post(t, c, s.Info.DLQ+"/console/reruns", form)
		if loc, _ := url.QueryUnescape(h.Get("Location")); code != http.StatusSeeOther || !strings.Contains(loc, want) {
			t.Fatalf("start, round %d: %d to %q, want a redirect saying %q", round, code, loc, want)
		}
	}
	for {
		r, err := s.Store.GetRerun(ctx, rerun.DocID(devstack.DevTenant, form.Get("rerun_id")))
		if err != nil {
			t.Fatal(err)
		}
		if r.State == task.RerunCompleted {
			if r.Progress.Done != 2 || !strings.Contains(r.By, devstack.DevOperator) {
				t.Fatalf("the re-run ended %+v, by %q; want 2 done, by operator %s", r.Progress, r.By, devstack.DevOperator)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the re-run did not complete: %+v", r.Progress)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, id := range ids {
		if v, err := api.Get(ctx, id); err != nil || v.Replay != 1 {
			t.Errorf("task %s: %+v %v, want replay 1", id, v, err)
		}
	}
}
