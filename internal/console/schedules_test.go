package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The Schedules page lists every tenant's schedules, the next to fire first and the paused ones
// last, and filters by tenant.
func TestSchedulesPage(t *testing.T) {
	t.Parallel()
	s := devstack.StartTest(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := client.New(s.Info.Publisher, s.Info.APIKey)
	tmpl := task.Request{Family: "summarize", Input: "the news of {{fire_date}}"}
	later, err := api.CreateSchedule(ctx, task.ScheduleRequest{Cron: "0 3 * * *", TimeZone: "Asia/Tokyo", Task: tmpl, Paused: true})
	if err != nil {
		t.Fatal(err)
	}
	soon, err := api.CreateSchedule(ctx, task.ScheduleRequest{Cron: "*/5 * * * *", TimeZone: "UTC", Task: tmpl, CatchUp: task.CatchUpAll})
	if err != nil {
		t.Fatal(err)
	}
	c := browser(t)
	login(t, c, s.Info.Console)

	code, body := get(t, c, s.Info.DLQ+"/console/schedules")
	if code != 200 {
		t.Fatalf("schedules: %d\n%s", code, body)
	}
	i, j := strings.Index(body, `data-schedule="`+soon.ScheduleID+`"`), strings.Index(body, `data-schedule="`+later.ScheduleID+`"`)
	if i < 0 || j < 0 || i > j {
		t.Errorf("the page lists %s at %d and the paused %s at %d: want both, the active one first:\n%s", soon.ScheduleID, i, later.ScheduleID, j, body)
	}
	for _, want := range []string{"<code>*/5 * * * *</code> UTC", "summarize/default", ">paused<", ">all<"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q:\n%s", want, body)
		}
	}
	if _, body = get(t, c, s.Info.DLQ+"/console/schedules?tenant=nobody"); !strings.Contains(body, "<caption>0 schedules") {
		t.Errorf("another tenant's filter shows schedules:\n%s", body)
	}
}
