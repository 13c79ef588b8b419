package main

import (
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// setStart delays req by submit's --delay or --start-after (one of them at most), which replace
// whatever delay a request file gave. The server checks the bounds.
func setStart(req *task.Request, delay, startAfter string) error {
	switch {
	case delay != "" && startAfter != "":
		return usageErr("--delay and --start-after exclude each other: give one")
	case delay != "":
		if d, err := time.ParseDuration(delay); err != nil || d < 0 {
			return usageErr("--delay %q: want a duration such as 90s or 2h", delay)
		}
		req.Delay, req.StartAfter = delay, nil
	case startAfter != "":
		at, err := time.Parse(time.RFC3339Nano, startAfter)
		if err != nil {
			return usageErr("--start-after %q: want an RFC 3339 time such as 2026-12-24T09:00:00Z", startAfter)
		}
		req.StartAfter, req.Delay = &at, ""
	}
	return nil
}
