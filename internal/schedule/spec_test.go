package schedule

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/pkg/task"
)

func mustParse(t *testing.T, expr, zone string) Spec {
	t.Helper()
	s, err := Parse(expr, zone)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fires lists the fire times after from, n of them, as RFC 3339 in the spec's zone.
func fires(s Spec, from time.Time, n int) []string {
	var out []string
	for at := from; len(out) < n; {
		at = s.Next(at)
		out = append(out, at.In(s.Location()).Format(time.RFC3339))
	}
	return out
}

// TestNextAcrossDST holds the wall-clock rule of Next across New York's 2026 transitions: spring
// forward (2026-03-08 02:00 EST -> 03:00 EDT) and fall back (2026-11-01 02:00 EDT -> 01:00 EST).
func TestNextAcrossDST(t *testing.T) {
	t.Parallel()
	ny, _ := time.LoadLocation("America/New_York")
	for _, tc := range []struct {
		name, expr string
		from       time.Time
		want       []string
	}{
		{"02:30 is skipped by spring forward: it fires at 03:30 EDT", "30 2 * * *", time.Date(2026, 3, 6, 12, 0, 0, 0, ny),
			[]string{"2026-03-07T02:30:00-05:00", "2026-03-08T03:30:00-04:00", "2026-03-09T02:30:00-04:00"}},
		{"02:30 on fall back day exists once", "30 2 * * *", time.Date(2026, 10, 30, 12, 0, 0, 0, ny),
			[]string{"2026-10-31T02:30:00-04:00", "2026-11-01T02:30:00-05:00", "2026-11-02T02:30:00-05:00"}},
		{"01:30 is repeated by fall back: it fires once, at its first occurrence", "30 1 * * *", time.Date(2026, 10, 31, 12, 0, 0, 0, ny),
			[]string{"2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"}},
		{"created inside the repeated hour, after its fire time: no second fire", "45 1 * * *", time.Date(2026, 11, 1, 6, 40, 0, 0, time.UTC),
			[]string{"2026-11-02T01:45:00-05:00"}},
		{"hourly across spring forward: the 02:00 fire merges with 03:00", "0 * * * *", time.Date(2026, 3, 8, 0, 30, 0, 0, ny),
			[]string{"2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"}},
		{"hourly across fall back: one fire per wall-clock hour", "0 * * * *", time.Date(2026, 11, 1, 0, 30, 0, 0, ny),
			[]string{"2026-11-01T01:00:00-04:00", "2026-11-01T02:00:00-05:00", "2026-11-01T03:00:00-05:00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := mustParse(t, tc.expr, "America/New_York")
			if diff := cmp.Diff(tc.want, fires(s, tc.from, len(tc.want))); diff != "" {
				t.Errorf("fires of %q after %s (-want +got):\n%s", tc.expr, tc.from, diff)
			}
		})
	}
}

func TestNextInZone(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "0 3 * * *", "Asia/Tokyo")
	got := s.Next(time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)) // 03:00 JST on the 8th
	if want := time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC); !got.Equal(want.Add(24 * time.Hour)) {
		t.Errorf("Next = %s, want the next day's 03:00 JST (%s): Next is strictly after", got, want.Add(24*time.Hour))
	}
	if got := s.Next(time.Date(2026, 12, 7, 17, 59, 0, 0, time.UTC)); !got.Equal(time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)) {
		t.Errorf("Next = %s, want 2026-12-08T03:00+09:00", got)
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr, zone string
		want       error
	}{
		{"61 * * * *", "UTC", ErrCron},
		{"* * *", "UTC", ErrCron},
		{"@every 1h", "UTC", ErrCron},
		{"CRON_TZ=Asia/Tokyo 0 3 * * *", "UTC", ErrCron},
		{"0 3 * * *", "Mars/Olympus", ErrZone},
		{"0 3 * * *", "", ErrZone},
		{"0 3 * * *", "Local", ErrZone},
	} {
		if _, err := Parse(tc.expr, tc.zone); !errors.Is(err, tc.want) {
			t.Errorf("Parse(%q, %q) = %v, want %v", tc.expr, tc.zone, err, tc.want)
		}
	}
	if _, err := Parse("@daily", "Europe/Paris"); err != nil {
		t.Errorf("Parse(@daily) = %v, want a descriptor accepted", err)
	}
}

// TestPlan holds the catch-up policies: hourly fires from 00:00, found at 05:10 (five missed,
// then on time at 05:00) or at 05:30 (all six missed).
func TestPlan(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "0 * * * *", "UTC")
	day := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	for _, tc := range []struct {
		name string
		now  time.Time
		c    CatchUp
		want Plan
	}{
		{"none, the latest on time", h(5).Add(10 * time.Second), CatchUpNone, Plan{Fire: []time.Time{h(5)}, Skipped: 5, Next: h(6)}},
		{"none, all missed", h(5).Add(30 * time.Minute), CatchUpNone, Plan{Skipped: 6, Next: h(6)}},
		{"last, all missed", h(5).Add(30 * time.Minute), CatchUpLast, Plan{Fire: []time.Time{h(5)}, Skipped: 5, Next: h(6)}},
		{"all", h(5).Add(30 * time.Minute), CatchUpAll, Plan{Fire: []time.Time{h(0), h(1), h(2), h(3), h(4), h(5)}, Next: h(6)}},
		{"not due", h(0).Add(-time.Second), CatchUpAll, Plan{Next: h(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, s.Plan(h(0), tc.now, tc.c)); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPlanBound holds MaxCatchUp: a minutely schedule stopped for a day fires its latest 100.
func TestPlanBound(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "* * * * *", "UTC")
	first := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	now := first.Add(24*time.Hour - time.Minute)
	p := s.Plan(first, now, CatchUpAll)
	if len(p.Fire) != MaxCatchUp || !p.Fire[MaxCatchUp-1].Equal(now) || !p.Fire[0].Equal(now.Add(-(MaxCatchUp-1)*time.Minute)) {
		t.Fatalf("Plan fires %d from %v to %v, want the %d up to %v", len(p.Fire), p.Fire[0], p.Fire[len(p.Fire)-1], MaxCatchUp, now)
	}
	if want := 24*60 - MaxCatchUp; p.Skipped != want {
		t.Errorf("Skipped = %d, want %d", p.Skipped, want)
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	tmpl := task.Request{Family: "summarize", Input: "news of {{fire_date}}", SubjectKey: "nightly/{{fire_date}}",
		Labels: map[string]string{"run": "{{fire_time}}"}}
	got := Render(tmpl, time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC), tokyo)
	want := task.Request{Family: "summarize", Input: "news of 2026-12-08", SubjectKey: "nightly/2026-12-08",
		Labels: map[string]string{"run": "2026-12-08T03:00:00+09:00"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Render (-want +got):\n%s", diff)
	}
	if tmpl.Labels["run"] != "{{fire_time}}" {
		t.Errorf("Render changed the template's labels: %v", tmpl.Labels)
	}
}

// FuzzSpec: any expression and zone either is refused or yields fire times that rise strictly.
func FuzzSpec(f *testing.F) {
	for _, s := range []string{"0 3 * * *", "*/5 * * * *", "30 2 * 3 SUN", "@daily", "0 0 29 2 *", "1-59/7 0-23/5 * * MON-FRI"} {
		f.Add(s, "America/New_York", int64(1772953200))
	}
	f.Add("0 3 * * *", "Asia/Tokyo", int64(0))
	f.Fuzz(func(t *testing.T, expr, zone string, unix int64) {
		s, err := Parse(expr, zone)
		if err != nil {
			return
		}
		at := time.Unix(unix%(1<<40), 0)
		for range 3 {
			next := s.Next(at)
			if next.IsZero() {
				return
			}
			if !next.After(at) {
				t.Fatalf("Parse(%q, %q).Next(%s) = %s, not after", expr, zone, at, next)
			}
			at = next
		}
	})
}
