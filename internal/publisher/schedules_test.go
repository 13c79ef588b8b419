package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/schedule"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func nightly() task.ScheduleRequest {
	return task.ScheduleRequest{Cron: "0 3 * * *", TimeZone: "Asia/Tokyo",
		Task: task.Request{Family: "summarize", Input: "the news of {{fire_date}}", SubjectKey: "nightly/{{fire_date}}"}}
}

// TestScheduleLifecycle creates, reads, lists, pauses, resumes and deletes a schedule through
// pkg/client; another tenant finds none of it.
func TestScheduleLifecycle(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	sc, err := e.api.CreateSchedule(ctx, nightly())
	if err != nil {
		t.Fatal(err)
	}
	if !scheduleIDRE.MatchString(sc.ScheduleID) {
		t.Fatalf("schedule_id %q is not an id", sc.ScheduleID)
	}
	spec, _ := schedule.Parse("0 3 * * *", "Asia/Tokyo")
	if want := spec.Next(time.Now()); sc.NextFireAt == nil || !sc.NextFireAt.Equal(want) {
		t.Errorf("next_fire_at = %v, want the next 03:00 in Tokyo, %s", sc.NextFireAt, want)
	}
	if sc.Overlap != task.OverlapSkip || sc.CatchUp != task.CatchUpLast || sc.Task.Variant != "default" {
		t.Errorf("overlap %q, catch_up %q, variant %q: want the defaults skip, last, default", sc.Overlap, sc.CatchUp, sc.Task.Variant)
	}
	got, err := e.api.GetSchedule(ctx, sc.ScheduleID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sc, got); diff != "" {
		t.Errorf("GET differs from the create's answer (-create +get):\n%s", diff)
	}
	list, err := e.api.ListSchedules(ctx, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Schedules) != 1 || list.Schedules[0].ScheduleID != sc.ScheduleID {
		t.Errorf("list = %+v, want the one schedule", list.Schedules)
	}

	paused, err := e.api.UpdateSchedule(ctx, sc.ScheduleID, task.SchedulePatch{Paused: new(true)})
	if err != nil {
		t.Fatal(err)
	}
	if !paused.Paused || paused.NextFireAt != nil {
		t.Errorf("paused: paused %v, next_fire_at %v; want true and none", paused.Paused, paused.NextFireAt)
	}
	resumed, err := e.api.UpdateSchedule(ctx, sc.ScheduleID, task.SchedulePatch{Paused: new(false), Cron: new("30 4 * * 1")})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ = schedule.Parse("30 4 * * 1", "Asia/Tokyo")
	if want := spec.Next(time.Now()); resumed.Paused || resumed.NextFireAt == nil || !resumed.NextFireAt.Equal(want) {
		t.Errorf("resumed: paused %v, next_fire_at %v; want false and %s", resumed.Paused, resumed.NextFireAt, want)
	}

	_, otherKey := e.newTenant("other", nil)
	other := client.New(e.url, otherKey, client.WithRetries(0))
	for name, call := range map[string]func() error{
		"get": func() error { _, err := other.GetSchedule(ctx, sc.ScheduleID); return err },
		"patch": func() error {
			_, err := other.UpdateSchedule(ctx, sc.ScheduleID, task.SchedulePatch{Paused: new(true)})
			return err
		},
		"delete": func() error { return other.DeleteSchedule(ctx, sc.ScheduleID) },
	} {
		var p *task.Problem
		if err := call(); !errors.As(err, &p) || p.Status != http.StatusNotFound {
			t.Errorf("another tenant's %s = %v, want a 404", name, err)
		}
	}
	if l, err := other.ListSchedules(ctx, 0, ""); err != nil || len(l.Schedules) != 0 {
		t.Errorf("another tenant's list = %+v, %v; want empty", l, err)
	}

	if err := e.api.DeleteSchedule(ctx, sc.ScheduleID); err != nil {
		t.Fatal(err)
	}
	var p *task.Problem
	if _, err := e.api.GetSchedule(ctx, sc.ScheduleID); !errors.As(err, &p) || p.Status != http.StatusNotFound {
		t.Errorf("GET after DELETE = %v, want a 404", err)
	}
}

// TestScheduleIdempotent: the same Idempotency-Key and body return the same schedule.
func TestScheduleIdempotent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := mustJSON(t, nightly())
	hdr := map[string]string{task.HeaderIdempotencyKey: "nightly-1"}
	code1, _, b1 := e.do("POST", "/v1/schedules", e.key, body, hdr)
	code2, h2, b2 := e.do("POST", "/v1/schedules", e.key, body, hdr)
	if code1 != http.StatusCreated || code2 != http.StatusOK || h2.Get(task.HeaderReplayed) != "true" {
		t.Fatalf("answers %d then %d (replayed %q), want 201 then 200 replayed", code1, code2, h2.Get(task.HeaderReplayed))
	}
	if loc := h2.Get("Location"); loc != e.url+"/v1/schedules/"+scheduleIDOf(t, b2) {
		t.Errorf("Location %q, want the schedule's URL", loc)
	}
	if string(b1) != string(b2) {
		t.Errorf("the replay answered %s, want %s", b2, b1)
	}
	other := nightly()
	other.Cron = "0 4 * * *"
	if code, _, _ := e.do("POST", "/v1/schedules", e.key, mustJSON(t, other), hdr); code != http.StatusUnprocessableEntity {
		t.Errorf("the key with another body = %d, want 422", code)
	}
}

func scheduleIDOf(t *testing.T, body []byte) string {
	t.Helper()
	var v task.Schedule
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	return v.ScheduleID
}

// TestScheduleRefused: an invalid expression, zone, policy or task template is a 400 naming the
// field; the template is validated as POST /v1/tasks validates a request.
func TestScheduleRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	soon := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name string
		edit func(*task.ScheduleRequest)
		want []string
	}{
		{"cron", func(r *task.ScheduleRequest) { r.Cron = "61 3 * * *" }, []string{"cron"}},
		{"never", func(r *task.ScheduleRequest) { r.Cron = "0 0 30 2 *" }, []string{"cron"}},
		{"interval", func(r *task.ScheduleRequest) { r.Cron = "@every 1h" }, []string{"cron"}},
		{"zone", func(r *task.ScheduleRequest) { r.TimeZone = "Mars/Olympus" }, []string{"time_zone"}},
		{"policies", func(r *task.ScheduleRequest) { r.Overlap, r.CatchUp = "maybe", "some" }, []string{"catch_up", "overlap"}},
		{"task", func(r *task.ScheduleRequest) { r.Task.Family, r.Task.Input = "nosuch", "" }, []string{"task.family", "task.input"}},
		{"deadline", func(r *task.ScheduleRequest) { r.Task.RunBefore = &soon }, []string{"task.run_before"}},
		{"files", func(r *task.ScheduleRequest) {
			r.Task.Files = []task.File{{URI: "gs://b/o.pdf", MIMEType: "application/pdf"}}
		}, []string{"task.files"}},
		{"expanded", func(r *task.ScheduleRequest) { r.Task.SubjectKey = string(make([]byte, 500)) + "{{fire_time}}" }, []string{"task.subject_key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := nightly()
			tc.edit(&req)
			code, h, body := e.do("POST", "/v1/schedules", e.key, mustJSON(t, req), nil)
			if code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", code, body)
			}
			if diff := cmp.Diff(tc.want, fields(problemOf(t, h, body))); diff != "" {
				t.Errorf("fields named (-want +got):\n%s", diff)
			}
		})
	}
}
