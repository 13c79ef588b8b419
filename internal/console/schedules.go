package console

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// scheduleLimit bounds the schedules the Schedules page reads.
const scheduleLimit = 1000

// schedulesData is the Schedules page: every tenant's schedules (or one tenant's), read only.
type schedulesData struct {
	Tenant    string
	Rows      []scheduleRow
	Truncated bool
}

type scheduleRow struct {
	*store.Schedule
	Family string // the template's family/variant
}

// schedules lists the schedules, the next to fire first and the paused ones last.
func (c *Console) schedules(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	tenant := strings.TrimSpace(r.URL.Query().Get("tenant"))
	var scs []*store.Schedule
	var err error
	if tenant != "" {
		scs, _, err = c.d.Store.ListSchedules(r.Context(), tenant, scheduleLimit, "")
	} else {
		scs, err = c.d.Store.AllSchedules(r.Context(), scheduleLimit)
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := schedulesData{Tenant: tenant, Truncated: len(scs) == scheduleLimit}
	for _, sc := range scs {
		var req task.Request
		row := scheduleRow{Schedule: sc, Family: "?"}
		if json.Unmarshal([]byte(sc.Task), &req) == nil {
			row.Family = req.Family + "/" + req.Variant
		}
		d.Rows = append(d.Rows, row)
	}
	slices.SortStableFunc(d.Rows, func(a, b scheduleRow) int {
		if c := cmp.Compare(boolRank(a.NextFireAt == nil), boolRank(b.NextFireAt == nil)); c != 0 || a.NextFireAt == nil {
			return c
		}
		return a.NextFireAt.Compare(*b.NextFireAt)
	})
	c.render(w, r, "schedules", page{Title: "Schedules", Nav: "schedules", Operator: sess.Operator, CSRF: sess.CSRF, Data: d})
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}
