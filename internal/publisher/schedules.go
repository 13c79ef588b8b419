package publisher

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/schedule"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// scheduleIDRE is the shape of a schedule id: a page token is one.
var scheduleIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkSchedule validates a schedule as it would be stored: its cron expression and time zone,
// its policies, and its task template as POST /v1/tasks validates a request, rendered for the
// schedule's next fire (so a template whose placeholders expand past a limit is refused). The
// template may not carry run_before: a fixed deadline would expire every later fire. It returns
// the parsed spec; a refusal is a 400 naming every refused field.
func (s *Server) checkSchedule(req *task.ScheduleRequest) (schedule.Spec, error) {
	var fs []task.FieldError
	bad := func(field, detail string) { fs = append(fs, task.FieldError{Field: field, Detail: detail}) }
	now := s.now()
	spec, err := schedule.Parse(req.Cron, req.TimeZone)
	switch {
	case errors.Is(err, schedule.ErrZone):
		bad("time_zone", err.Error())
	case err != nil:
		bad("cron", err.Error())
	case spec.Next(now).IsZero():
		bad("cron", "never fires within five years")
	}
	if !schedule.Overlap(req.Overlap).Valid() {
		bad("overlap", fmt.Sprintf("must be %q or %q", task.OverlapSkip, task.OverlapQueue))
	}
	if !schedule.CatchUp(req.CatchUp).Valid() {
		bad("catch_up", fmt.Sprintf("must be %q, %q or %q", task.CatchUpNone, task.CatchUpLast, task.CatchUpAll))
	}
	if req.Task.RunBefore != nil {
		bad("task.run_before", "a schedule's task cannot have a fixed deadline")
	}
	if len(req.Task.Files) > 0 {
		// Each fire would read the same objects; the firer resolves no files (it runs in the
		// worker, without the publisher's signer), so a template with files is refused here
		// rather than failing at every fire.
		bad("task.files", "a schedule's task cannot name files")
	}
	normalize(&req.Task)
	sample := req.Task
	if err == nil {
		sample = schedule.Render(req.Task, spec.Next(now), spec.Location())
	}
	sample.Files = nil // refused above, once
	v := validator{families: s.families, checkCallback: s.checkURL, now: now}
	if _, err := v.validate(&sample); err != nil {
		p := problemFor(err)
		if p.Status >= http.StatusInternalServerError {
			return spec, err
		}
		for _, f := range p.Errors {
			bad("task."+f.Field, f.Detail)
		}
	}
	if len(fs) == 0 {
		return spec, nil
	}
	slices.SortStableFunc(fs, func(a, b task.FieldError) int { return cmp.Compare(a.Field, b.Field) })
	return spec, httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, fmt.Sprintf("%d invalid field(s); first %s: %s", len(fs), fs[0].Field, fs[0].Detail), fs...)
}

// scheduleDefaults fills the policies a request left out.
func scheduleDefaults(req *task.ScheduleRequest) {
	req.Overlap = cmp.Or(req.Overlap, task.OverlapSkip)
	req.CatchUp = cmp.Or(req.CatchUp, task.CatchUpLast)
}

// scheduleID is a new schedule's id: random, or derived from the tenant's idempotency key.
func scheduleID(tenant, key string) string {
	if key == "" {
		return randomID()
	}
	sum := sha256.Sum256([]byte("genbox/schedule\x00" + tenant + "\x00" + key))
	return hex.EncodeToString(sum[:16])
}

func (s *Server) handleCreateSchedule(w http.ResponseWriter, r *http.Request, tenant string) error {
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	var req task.ScheduleRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	scheduleDefaults(&req)
	spec, err := s.checkSchedule(&req)
	if err != nil {
		return err
	}
	tmpl, err := json.Marshal(req.Task)
	if err != nil {
		return fmt.Errorf("encode task template: %w", err)
	}
	hash := sha256.Sum256(append([]byte(req.Cron+"\x00"+req.TimeZone+"\x00"+req.Overlap+"\x00"+req.CatchUp+"\x00"+strconv.FormatBool(req.Paused)+"\x00"), tmpl...))
	sc := &store.Schedule{ID: scheduleID(tenant, key), Tenant: tenant, Cron: req.Cron, TimeZone: req.TimeZone, Task: string(tmpl),
		Overlap: req.Overlap, CatchUp: req.CatchUp, Paused: req.Paused, IdempotencyKey: key, RequestHash: hex.EncodeToString(hash[:])}
	if !req.Paused {
		next := spec.Next(s.now()).UTC()
		sc.NextFireAt = &next
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	err = s.st.CreateSchedule(ctx, sc)
	if errors.Is(err, store.ErrExists) && key != "" {
		old, gerr := s.st.GetSchedule(ctx, sc.ID)
		if gerr != nil {
			return gerr
		}
		if old.Tenant != tenant || old.RequestHash != sc.RequestHash {
			return httpapi.Problem(http.StatusUnprocessableEntity, probIdemMismatch, "this Idempotency-Key was used with a different request",
				task.FieldError{Field: task.HeaderIdempotencyKey, Detail: "already used with a different request"})
		}
		w.Header().Set(task.HeaderReplayed, "true")
		return s.writeSchedule(w, r, http.StatusOK, old)
	}
	if err != nil {
		return err
	}
	return s.writeSchedule(w, r, http.StatusCreated, sc)
}

// writeSchedule answers sc's view with code, and its Location when it answers a create.
func (s *Server) writeSchedule(w http.ResponseWriter, r *http.Request, code int, sc *store.Schedule) error {
	v, err := scheduleView(sc)
	if err != nil {
		return err
	}
	if r.Method == http.MethodPost {
		w.Header().Set("Location", s.baseURL(r)+"/v1/schedules/"+sc.ID)
	}
	httpapi.JSON(w, code, "application/json", v)
	return nil
}

// scheduleView is sc as the API shows it.
func scheduleView(sc *store.Schedule) (task.Schedule, error) {
	v := task.Schedule{ScheduleID: sc.ID, Cron: sc.Cron, TimeZone: sc.TimeZone, Overlap: sc.Overlap, CatchUp: sc.CatchUp, Paused: sc.Paused,
		NextFireAt: sc.NextFireAt, LastFireAt: sc.LastFireAt, LastTaskID: sc.LastTaskID, Fires: sc.Fires, SkippedFires: sc.Skipped,
		LastError: sc.LastError, CreatedAt: sc.CreatedAt, UpdatedAt: sc.UpdatedAt}
	if err := json.Unmarshal([]byte(sc.Task), &v.Task); err != nil {
		return v, fmt.Errorf("decode schedule %s's task: %w", sc.ID, err)
	}
	return v, nil
}

// ownSchedule reads the schedule of tenant the request's path names (own).
func (s *Server) ownSchedule(r *http.Request, tenant string) (*store.Schedule, error) {
	return own(s, r, tenant, s.st.GetSchedule, func(sc *store.Schedule) string { return sc.Tenant })
}

func (s *Server) handleGetSchedule(w http.ResponseWriter, r *http.Request, tenant string) error {
	sc, err := s.ownSchedule(r, tenant)
	if err != nil {
		return err
	}
	return s.writeSchedule(w, r, http.StatusOK, sc)
}

func (s *Server) handleListSchedules(w http.ResponseWriter, r *http.Request, tenant string) error {
	limit, err := pageSize(r, maxPageSize)
	if err != nil {
		return err
	}
	after := r.URL.Query().Get("page_token")
	if after != "" && !scheduleIDRE.MatchString(after) {
		return fieldProblem("page_token", "is not a page token of this listing")
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	scs, next, err := s.st.ListSchedules(ctx, tenant, limit, after)
	if err != nil {
		return err
	}
	out := task.ScheduleList{Schedules: make([]task.Schedule, 0, len(scs)), NextPageToken: next}
	for _, sc := range scs {
		v, err := scheduleView(sc)
		if err != nil {
			return err
		}
		out.Schedules = append(out.Schedules, v)
	}
	httpapi.JSON(w, http.StatusOK, "application/json", out)
	return nil
}

// patched is the schedule sc with p applied, as a request.
func patched(sc *store.Schedule, p task.SchedulePatch) (task.ScheduleRequest, error) {
	req := task.ScheduleRequest{Cron: sc.Cron, TimeZone: sc.TimeZone, Overlap: sc.Overlap, CatchUp: sc.CatchUp, Paused: sc.Paused}
	if err := json.Unmarshal([]byte(sc.Task), &req.Task); err != nil {
		return req, fmt.Errorf("decode schedule %s's task: %w", sc.ID, err)
	}
	req.Cron = *cmp.Or(p.Cron, &req.Cron)
	req.TimeZone = *cmp.Or(p.TimeZone, &req.TimeZone)
	req.Overlap = *cmp.Or(p.Overlap, &req.Overlap)
	req.CatchUp = *cmp.Or(p.CatchUp, &req.CatchUp)
	req.Paused = *cmp.Or(p.Paused, &req.Paused)
	if p.Task != nil {
		req.Task = *p.Task
	}
	return req, nil
}

// handlePatchSchedule replaces the fields the body holds. A new cron expression or time zone,
// or a resume, fires next at the first fire time after now (fires missed while paused are not
// caught up); a pause stops the fires; any other change keeps the next fire time.
func (s *Server) handlePatchSchedule(w http.ResponseWriter, r *http.Request, tenant string) error {
	id, err := pathID(r, "id")
	if err != nil {
		return err
	}
	var p task.SchedulePatch
	if err := s.decodeBody(w, r, &p); err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	sc, err := s.st.MutateSchedule(ctx, id, func(sc *store.Schedule, now time.Time) error {
		if sc.Tenant != tenant {
			return store.ErrNotFound
		}
		req, err := patched(sc, p)
		if err != nil {
			return err
		}
		spec, err := s.checkSchedule(&req)
		if err != nil {
			return err
		}
		tmpl, err := json.Marshal(req.Task)
		if err != nil {
			return fmt.Errorf("encode task template: %w", err)
		}
		when := req.Cron != sc.Cron || req.TimeZone != sc.TimeZone || req.Paused != sc.Paused
		sc.Cron, sc.TimeZone, sc.Task, sc.Overlap, sc.CatchUp, sc.Paused = req.Cron, req.TimeZone, string(tmpl), req.Overlap, req.CatchUp, req.Paused
		switch {
		case sc.Paused:
			sc.NextFireAt = nil
		case when || sc.NextFireAt == nil:
			next := spec.Next(now).UTC()
			sc.NextFireAt = &next
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.writeSchedule(w, r, http.StatusOK, sc)
}

// handleDeleteSchedule deletes the schedule: it fires no more; the tasks it fired stay.
func (s *Server) handleDeleteSchedule(w http.ResponseWriter, r *http.Request, tenant string) error {
	id, err := pathID(r, "id")
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	err = s.st.DeleteSchedule(ctx, id, func(sc *store.Schedule) error {
		if sc.Tenant != tenant {
			return fmt.Errorf("schedule %s: %w", id, store.ErrNotFound)
		}
		return nil
	})
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
