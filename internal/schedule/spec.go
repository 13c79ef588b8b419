// Package schedule owns recurring schedules (docs/api.md, "Schedules"): what a cron expression in
// a time zone fires and when, which of the fires a pass submits under its catch-up policy, the
// fire time a task template may name, and the Firer, whose leader submits each due fire once
// through the publisher's intake path under an id derived from the schedule and the fire time.
package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Overlap says what a fire does while the previous fire's task has not finished.
type Overlap string

// Overlap policies.
const (
	// OverlapSkip skips the fire: it is counted as skipped and the schedule moves on.
	OverlapSkip Overlap = task.OverlapSkip
	// OverlapQueue submits the fire anyway.
	OverlapQueue Overlap = task.OverlapQueue
)

// Valid reports whether o is a policy.
func (o Overlap) Valid() bool { return o == OverlapSkip || o == OverlapQueue }

// CatchUp says which fires run of those missed while no firer ran.
type CatchUp string

// Catch-up policies.
const (
	// CatchUpNone runs no missed fire.
	CatchUpNone CatchUp = task.CatchUpNone
	// CatchUpLast runs only the latest missed fire.
	CatchUpLast CatchUp = task.CatchUpLast
	// CatchUpAll runs each missed fire, oldest first, up to MaxCatchUp of them (the latest).
	CatchUpAll CatchUp = task.CatchUpAll
)

// Valid reports whether c is a policy.
func (c CatchUp) Valid() bool { return c == CatchUpNone || c == CatchUpLast || c == CatchUpAll }

// MaxCatchUp bounds the missed fires CatchUpAll runs: after a longer outage only the latest
// MaxCatchUp run, and the older ones are counted as skipped.
const MaxCatchUp = 100

// Missed is how late a fire may be found and still count as on time: a fire found later was
// missed (no firer ran), and the catch-up policy decides whether it runs. It is well above the
// firer's interval and a leader's takeover, so a fire is missed only across an outage.
const Missed = 5 * time.Minute

// maxWalk bounds the fire times one plan walks: a minutely schedule stopped for two years.
const maxWalk = 1 << 20

// parser reads the standard five fields (minute, hour, day of month, month, day of week) and
// the descriptors (@daily, @hourly...).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Spec is a cron expression in a time zone.
type Spec struct {
	sched *cron.SpecSchedule // in wall-clock time: its location is UTC
	loc   *time.Location
}

// ErrCron and ErrZone say which part of a schedule does not parse.
var (
	ErrCron = errors.New("schedule: invalid cron expression")
	ErrZone = errors.New("schedule: unknown time zone")
)

// Parse reads a five-field cron expression (robfig/cron's standard syntax, descriptors
// included, "@every" excluded: it is no time of day) and an IANA time zone name.
func Parse(expr, zone string) (Spec, error) {
	if zone == "" || zone == "Local" {
		return Spec{}, fmt.Errorf("%w: %q (an IANA name such as \"Asia/Tokyo\" or \"UTC\")", ErrZone, zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: %q", ErrZone, zone)
	}
	e := strings.TrimSpace(expr)
	if strings.HasPrefix(e, "CRON_TZ=") || strings.HasPrefix(e, "TZ=") {
		return Spec{}, fmt.Errorf("%w: the time zone goes in time_zone, not in the expression", ErrCron)
	}
	s, err := parser.Parse(e)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: %w", ErrCron, err)
	}
	ss, ok := s.(*cron.SpecSchedule)
	if !ok {
		return Spec{}, fmt.Errorf("%w: %q is an interval, not a time of day", ErrCron, e)
	}
	ss.Location = time.UTC
	return Spec{sched: ss, loc: loc}, nil
}

// Location is the spec's time zone.
func (s Spec) Location() *time.Location { return s.loc }

// Next is the first fire strictly after t, or the zero time when there is none within five
// years. Fires follow the zone's wall clock, as RFC 5545 resolves local times: a wall time the
// zone skips (spring forward) fires at the same distance past the gap's start in the new offset —
// 02:30 in New York's spring forward fires at 03:30 EDT —, and a wall time the zone repeats
// (fall back) fires once, at its first occurrence.
func (s Spec) Next(t time.Time) time.Time {
	wall := wallOf(t.In(s.loc))
	for range 1000 {
		wall = s.sched.Next(wall)
		if wall.IsZero() {
			return time.Time{}
		}
		if at := s.instant(wall); at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// wallOf is t's wall clock in its zone as a UTC time (seconds and below dropped: fires are on
// minutes).
func wallOf(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), 0, 0, time.UTC)
}

// instant is the earliest instant whose wall clock in the spec's zone is wall; in a gap, wall
// read with the offset in force before it.
func (s Spec) instant(wall time.Time) time.Time {
	before := offset(wall.Add(-36*time.Hour), s.loc)
	var best time.Time
	for _, off := range []int{before, offset(wall.Add(36*time.Hour), s.loc)} {
		at := wall.Add(-time.Duration(off) * time.Second)
		if _, o := at.In(s.loc).Zone(); o == off && (best.IsZero() || at.Before(best)) {
			best = at
		}
	}
	if best.IsZero() {
		best = wall.Add(-time.Duration(before) * time.Second)
	}
	return best.In(s.loc)
}

// offset is loc's offset in seconds at the instant whose UTC clock reads wall.
func offset(wall time.Time, loc *time.Location) int {
	_, o := wall.In(loc).Zone()
	return o
}

// Plan is what a pass does with a schedule whose next fire is due.
type Plan struct {
	// Fire are the fire times to submit, oldest first.
	Fire []time.Time
	// Skipped counts the due fire times the catch-up policy (or MaxCatchUp) leaves out.
	Skipped int
	// Next is the first fire time after now: the schedule's next_fire_at once Fire is submitted.
	Next time.Time
}

// Plan returns what to fire of the fire times from first (the schedule's next_fire_at) to now.
// The latest of them is on time when found within Missed of it; every other one was missed. The
// on-time fire always runs; of the missed ones, CatchUpNone runs none, CatchUpLast the latest
// (when there is no on-time fire), CatchUpAll each, up to MaxCatchUp.
func (s Spec) Plan(first, now time.Time, c CatchUp) Plan {
	var due []time.Time // the due fire times, oldest first, cut to the latest MaxCatchUp now and then
	total := 0
	at := first
	for ; !at.IsZero() && !at.After(now) && total < maxWalk; at = s.Next(at) {
		total++
		if len(due) == 2*MaxCatchUp {
			due = append(due[:0], due[MaxCatchUp:]...)
		}
		due = append(due, at)
	}
	if total == maxWalk {
		at = s.Next(now)
	}
	due = due[max(0, len(due)-MaxCatchUp):]
	p := Plan{Next: at}
	if len(due) == 0 {
		return p
	}
	last := due[len(due)-1]
	switch {
	case c == CatchUpAll:
		p.Fire = due
	case c == CatchUpLast || now.Sub(last) <= Missed:
		p.Fire = []time.Time{last}
	}
	p.Skipped = total - len(p.Fire)
	return p
}
