package schedule

import (
	"maps"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// The placeholders a task template may hold in its subject_key, its input and its label values;
// each fire's task has them replaced by its fire time in the schedule's time zone.
const (
	// FireTime is the fire time in RFC 3339 with the zone's offset: 2026-12-08T03:00:00+09:00.
	FireTime = "{{fire_time}}"
	// FireDate is the fire time's date in the zone: 2026-12-08.
	FireDate = "{{fire_date}}"
)

// Render is the task request of the fire at at: tmpl with FireTime and FireDate replaced in its
// subject_key, input and label values by at in loc.
func Render(tmpl task.Request, at time.Time, loc *time.Location) task.Request {
	local := at.In(loc)
	r := strings.NewReplacer(FireTime, local.Format(time.RFC3339), FireDate, local.Format(time.DateOnly))
	out := tmpl
	out.SubjectKey = r.Replace(tmpl.SubjectKey)
	out.Input = r.Replace(tmpl.Input)
	if tmpl.Labels != nil {
		out.Labels = maps.Clone(tmpl.Labels)
		for k, v := range out.Labels {
			out.Labels[k] = r.Replace(v)
		}
	}
	return out
}

// FireKey is the idempotency key the fire of schedule id at at is submitted under: the task's
// id derives from it (and the tenant), so submitting the same fire again finds its task.
func FireKey(id string, at time.Time) string {
	return "schedule:" + id + ":" + at.UTC().Format(time.RFC3339)
}
