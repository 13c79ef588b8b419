package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

var scheduleID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// The schedule verbs against a running stack: a minutely schedule created with create fires
// through the worker's firer — its task succeeds with the fire's day in its subject key — and
// list, get, pause, resume and delete answer with the documented exit codes.
func TestScheduleVerbs(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	env := cliEnv(s)

	r := cli(t, env, "", "schedule", "create", "--cron", "* * * * *", "--time-zone", "Asia/Tokyo", "--overlap", "queue",
		"--family", "summarize", "--input", "the news at {{fire_time}}", "--subject-key", "minutely/{{fire_date}}", "--label", "day={{fire_date}}")
	id := strings.TrimSpace(r.stdout)
	if r.code != exitOK || !scheduleID.MatchString(id) {
		t.Fatalf("schedule create: exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	// The first fire is at most a minute away; the firer runs every sweep interval.
	var sc task.Schedule
	deadline := time.Now().Add(2 * time.Minute)
	for sc.LastTaskID == "" && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		r = cli(t, env, "", "schedule", "get", "--json", id)
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &sc) != nil {
			t.Fatalf("schedule get: exit %d %q %s", r.code, r.stdout, r.stderr)
		}
	}
	if sc.LastTaskID == "" || sc.Fires < 1 {
		t.Fatalf("no fire in two minutes: %+v", sc)
	}
	r = cli(t, env, "", "get", "--json", sc.LastTaskID)
	var v task.View
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &v) != nil {
		t.Fatalf("get the fire's task: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	if want := sc.LastFireAt.In(tokyo).Format(time.DateOnly); v.Labels["day"] != want {
		t.Errorf("the fire's task has the label day=%q, want its fire's date in Tokyo, %q", v.Labels["day"], want)
	}

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"list", []string{"schedule", "list"}, exitOK, id, ""},
		{"get text", []string{"schedule", "get", "--text", id}, exitOK, "cron         * * * * * (Asia/Tokyo)", ""},
		{"pause", []string{"schedule", "pause", "--json", id}, exitOK, `"paused": true`, ""},
		{"resume", []string{"schedule", "resume", "--json", id}, exitOK, `"next_fire_at"`, ""},
		{"bad cron", []string{"schedule", "create", "--cron", "61 * * * *", "--family", "summarize", "--input", "x"}, exitRejected, "", "cron"},
		{"bad zone", []string{"schedule", "create", "--cron", "0 3 * * *", "--time-zone", "Mars/Olympus", "--family", "summarize", "--input", "x"}, exitRejected, "", "time_zone"},
		{"no cron", []string{"schedule", "create", "--family", "summarize", "--input", "x"}, exitUsage, "", "--cron"},
		{"delete", []string{"schedule", "delete", id}, exitOK, "", "deleted"},
		{"get deleted", []string{"schedule", "get", id}, exitNotFound, "", "404"},
		{"unknown action", []string{"schedule", "fire", id}, exitUsage, "", "unknown schedule action"},
	} {
		r := cli(t, env, "", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
			t.Errorf("%s: exit %d (want %d)\nstdout: %s\nstderr: %s", tc.name, r.code, tc.code, r.stdout, r.stderr)
		}
	}
}
