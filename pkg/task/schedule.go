package task

import "time"

// Schedule policies (docs/api.md, "Schedules").
const (
	// OverlapSkip skips a fire while the previous fire's task has not finished (the default).
	OverlapSkip = "skip"
	// OverlapQueue submits every fire, whatever the previous one's task is doing.
	OverlapQueue = "queue"
	// CatchUpNone runs no fire missed while genbox was down.
	CatchUpNone = "none"
	// CatchUpLast runs only the latest missed fire (the default).
	CatchUpLast = "last"
	// CatchUpAll runs every missed fire, oldest first, up to the latest 100.
	CatchUpAll = "all"
)

// ScheduleRequest is the body of POST /v1/schedules: a cron expression in an IANA time zone and
// the task request each fire submits, as POST /v1/tasks takes it. The task's subject_key, input
// and label values may hold {{fire_time}} and {{fire_date}}.
type ScheduleRequest struct {
	Cron     string  `json:"cron"`
	TimeZone string  `json:"time_zone"`
	Task     Request `json:"task"`
	// Overlap is skip (default) or queue.
	Overlap string `json:"overlap,omitempty"`
	// CatchUp is last (default), none or all.
	CatchUp string `json:"catch_up,omitempty"`
	Paused  bool   `json:"paused,omitempty"`
}

// SchedulePatch is the body of PATCH /v1/schedules/{id}: each field present replaces the
// schedule's.
type SchedulePatch struct {
	Cron     *string  `json:"cron,omitempty"`
	TimeZone *string  `json:"time_zone,omitempty"`
	Task     *Request `json:"task,omitempty"`
	Overlap  *string  `json:"overlap,omitempty"`
	CatchUp  *string  `json:"catch_up,omitempty"`
	Paused   *bool    `json:"paused,omitempty"`
}

// Schedule is a schedule as the API shows it.
type Schedule struct {
	ScheduleID string  `json:"schedule_id"`
	Cron       string  `json:"cron"`
	TimeZone   string  `json:"time_zone"`
	Task       Request `json:"task"`
	Overlap    string  `json:"overlap"`
	CatchUp    string  `json:"catch_up"`
	Paused     bool    `json:"paused"`
	// NextFireAt is when the schedule fires next; absent while it is paused.
	NextFireAt *time.Time `json:"next_fire_at,omitempty"`
	LastFireAt *time.Time `json:"last_fire_at,omitempty"`
	// LastTaskID is the task of the latest fire.
	LastTaskID string `json:"last_task_id,omitempty"`
	// Fires counts the fires submitted; SkippedFires those skipped (overlap, catch-up, or a
	// template the task validation refused at fire time: LastError says why).
	Fires        int64     `json:"fires"`
	SkippedFires int64     `json:"skipped_fires"`
	LastError    string    `json:"last_error,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// ScheduleList is a page of GET /v1/schedules.
type ScheduleList struct {
	Schedules     []Schedule `json:"schedules"`
	NextPageToken string     `json:"next_page_token,omitempty"`
}
