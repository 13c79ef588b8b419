package publisher

import (
	"fmt"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// delayPattern is the OpenAPI pattern of delay: the non-negative durations time.ParseDuration
// reads.
const delayPattern = `^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`

// checkStart checks a request's start_after or delay at now: one of them at most, in the
// future (a delay of zero is none), at most task.MaxDelay ahead, and before run_before.
func checkStart(req *task.Request, now time.Time) []task.FieldError {
	bad := func(field, format string, args ...any) []task.FieldError {
		return []task.FieldError{{Field: field, Detail: fmt.Sprintf(format, args...)}}
	}
	field := "start_after"
	switch {
	case req.StartAfter != nil && req.Delay != "":
		return bad("delay", "start_after and delay exclude each other: give one")
	case req.StartAfter != nil:
		if !req.StartAfter.After(now) {
			return bad(field, "must be in the future")
		}
	case req.Delay != "":
		field = "delay"
		d, err := time.ParseDuration(req.Delay)
		if err != nil {
			return bad(field, `must be a duration such as "90s" or "1h30m"`)
		}
		if d < 0 {
			return bad(field, "must not be negative")
		}
	default:
		return nil
	}
	start, ok := asked(req, now)
	if !ok {
		return nil
	}
	if start.Sub(now) > task.MaxDelay {
		return bad(field, "must be at most %s (30 days) ahead", task.MaxDelay)
	}
	if req.RunBefore != nil && !start.Before(*req.RunBefore) {
		return bad(field, "must be before run_before")
	}
	return nil
}

// startOf is when a request checkStart accepted asks its task to start — start_after, or now plus
// delay — rounded up to the microsecond Firestore keeps, so the stored time is never earlier than
// the one asked; nil when the task starts at once.
func startOf(req *task.Request, now time.Time) *time.Time {
	at, ok := asked(req, now)
	if !ok {
		return nil
	}
	if r := at.Truncate(time.Microsecond); r.Before(at) {
		at = r.Add(time.Microsecond)
	}
	at = at.UTC()
	return &at
}

// asked is the start time req asks for at now, and whether it asks for a delay at all.
func asked(req *task.Request, now time.Time) (time.Time, bool) {
	switch {
	case req.StartAfter != nil:
		return *req.StartAfter, true
	case req.Delay != "":
		d, err := time.ParseDuration(req.Delay)
		if err != nil || d <= 0 {
			return time.Time{}, false
		}
		return now.Add(d), true
	}
	return time.Time{}, false
}
