package obs_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Not parallel (global telemetry). A generation that dies is counted dead with its retries by
// class; the approver's Regenerate counts it queued again (dlqnotifier); the regenerated run
// counts running and succeeded; the open dead letter shows in the gauge until decided.
//
//nolint:paralleltest // it installs global telemetry
func TestDeadAndRegeneratedAreCounted(t *testing.T) {
	r := start(t, "GENBOX_TASK_ATTEMPTS", "1", "GENBOX_MAX_ATTEMPTS", "1", "GENBOX_MODEL_CHAIN", "m-obs")
	s := r.stack
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s.Fake.FailNext("m-obs", 503)
	v := s.SubmitWait(t, ctx, task.Request{Family: "summarize", Input: "A report that dies once."})
	if v.State != task.StateDead {
		t.Fatalf("task ended %v, want dead", v)
	}
	dlID := protocol.DeadLetterID(v.TaskID, task.StageGeneration, 0, 0)
	s.WaitDeadLetterPosted(t, ctx, dlID)
	for r.tel.Sum(t, obs.MetricDeadLettersOpen, "stage=generation") != 1 {
		if ctx.Err() != nil {
			t.Fatalf("%s{stage=generation} never 1: %v", obs.MetricDeadLettersOpen, r.tel.Points(t, obs.MetricDeadLettersOpen))
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.PostForm(s.Info.SlackConsole+"console/click", url.Values{"dl": {dlID}, "action_id": {"regenerate"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("console click answered %s", resp.Status)
	}
	if _, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.ID == task.EventID(v.TaskID, task.EventSucceeded, 1) }); err != nil {
		got, gerr := s.Store.GetTask(context.Background(), v.TaskID)
		t.Fatalf("no success webhook after Regenerate: %v; task %+v (%v)", err, got, gerr)
	}
	for state, want := range map[string]float64{"queued": 2, "running": 2, "dead": 1, "succeeded": 1} {
		if got := r.tel.Sum(t, obs.MetricTasks, "state="+state, "family=summarize"); got != want {
			t.Errorf("%s{state=%s} = %g, want %g", obs.MetricTasks, state, got, want)
		}
	}
	if got := r.tel.Sum(t, obs.MetricGenLatency, "model=m-obs"); got != 2 {
		t.Errorf("%s{model=m-obs} count %g, want 2 (the failed generation and the regenerated one)", obs.MetricGenLatency, got)
	}
	for r.tel.Sum(t, obs.MetricDeadLettersOpen, "stage=generation") != 0 {
		if ctx.Err() != nil {
			t.Fatalf("%s{stage=generation} never back to 0", obs.MetricDeadLettersOpen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
