package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

const scheduleSynopsis = "create --cron EXPR --time-zone ZONE [task flags] | list | get ID | pause ID | resume ID | delete ID"

const scheduleDescription = `Recurring schedules of your tenant (GENBOX_API_KEY): each fire of the cron expression, in the
time zone, submits the task request once (docs/api.md, "Schedules").
  create  the task request as submit takes it (--file, or --family and --input...); the task's
          subject_key, input and label values may hold {{fire_time}} and {{fire_date}}, which
          each fire replaces with its time in the zone. Prints the schedule's id (--json: it all).
  list    your schedules, one page (--page-token for the next)
  get     a schedule: its next and last fire, fires and skipped fires, the last refusal
  pause   stop firing; resume fires next at the first fire time after now (none caught up)
  delete  fire no more; the tasks it fired stay`

func runSchedule(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "schedule", scheduleSynopsis, scheduleDescription)
	var api apiFlags
	api.register(fs, e, envAPIKey)
	expr := fs.String("cron", "", "create: five-field cron expression (minute hour day-of-month month day-of-week) or @daily, @hourly...")
	zone := fs.String("time-zone", "UTC", "create: the IANA time zone the expression is read in (e.g. Asia/Tokyo)")
	overlap := fs.String("overlap", task.OverlapSkip, "create: skip a fire while the previous fire's task runs (skip), or submit it anyway (queue)")
	catchUp := fs.String("catch-up", task.CatchUpLast, "create: fires missed while genbox was down: none, last, or all (the latest 100)")
	paused := fs.Bool("paused", false, "create: create it paused")
	file := fs.String("file", "", "create: read the JSON task request from this file (- for stdin)")
	family := fs.String("family", "", "create: the task's prompt family")
	variant := fs.String("variant", "", "create: the family's variant")
	input := fs.String("input", "", "create: the task's input text")
	inputFile := fs.String("input-file", "", "create: read the input text from this file (- for stdin)")
	subject := fs.String("subject-key", "", "create: what a stale fallback is keyed by (e.g. nightly/{{fire_date}})")
	callback := fs.String("callback-url", e.getenv(envCallbackURL), "create: where each fire's signed webhook goes ("+envCallbackURL+")")
	labels := labelsFlag{}
	fs.Var(labels, "label", "create: a label key=value (repeatable)")
	idemKey := fs.String("idempotency-key", "", "create: the intent's key: creating again with it returns the same schedule (default: a fresh key)")
	limit := fs.Int("limit", 100, "list: schedules per page")
	page := fs.String("page-token", "", "list: the page to show (printed after a page)")
	output := formatFlags(fs)
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErr("schedule needs an action: genbox schedule %s", scheduleSynopsis)
	}
	action, rest := pos[0], pos[1:]
	if action == "create" || action == "list" {
		if len(rest) > 0 {
			return usageErr("schedule %s takes no arguments (see --help)", action)
		}
	} else if len(rest) != 1 {
		return usageErr("schedule %s takes exactly one schedule id (see `genbox schedule list`)", action)
	}
	var req task.ScheduleRequest
	if action == "create" {
		if *expr == "" {
			return usageErr("schedule create needs --cron")
		}
		if req.Task, err = buildRequest(e, *file, *family, *input, *inputFile); err != nil {
			return err
		}
		if *variant != "" {
			req.Task.Variant = *variant
		}
		if *subject != "" {
			req.Task.SubjectKey = *subject
		}
		if *callback != "" && req.Task.CallbackURL == "" {
			req.Task.CallbackURL = *callback
		}
		for k, v := range labels {
			if req.Task.Labels == nil {
				req.Task.Labels = map[string]string{}
			}
			req.Task.Labels[k] = v
		}
		req.Cron, req.TimeZone, req.Overlap, req.CatchUp, req.Paused = *expr, *zone, *overlap, *catchUp, *paused
	}
	c, err := api.client(envAPIKey)
	if err != nil {
		return err
	}
	var sc *task.Schedule
	switch action {
	case "create":
		if *idemKey == "" {
			*idemKey = client.NewIdempotencyKey()
		}
		if sc, err = c.CreateScheduleWithKey(ctx, *idemKey, req); err != nil {
			return fmt.Errorf("schedule create: %w", err)
		}
		if *output.json {
			return printJSON(e.stdout, sc)
		}
		fmt.Fprintln(e.stdout, sc.ScheduleID)
		return nil
	case "list":
		out, err := c.ListSchedules(ctx, *limit, *page)
		if err != nil {
			return fmt.Errorf("schedule list: %w", err)
		}
		if *output.json {
			return printJSON(e.stdout, out)
		}
		return scheduleTable(e.stdout, out)
	case "get":
		sc, err = c.GetSchedule(ctx, rest[0])
	case "pause", "resume":
		sc, err = c.UpdateSchedule(ctx, rest[0], task.SchedulePatch{Paused: new(action == "pause")})
	case "delete":
		if err := c.DeleteSchedule(ctx, rest[0]); err != nil {
			return fmt.Errorf("schedule delete %s: %w", rest[0], err)
		}
		fmt.Fprintf(e.stderr, "schedule %s deleted\n", rest[0])
		return nil
	default:
		return usageErr("unknown schedule action %q: genbox schedule %s", action, scheduleSynopsis)
	}
	if err != nil {
		return fmt.Errorf("schedule %s %s: %w", action, rest[0], err)
	}
	return showSchedule(e.stdout, output.asJSON(e.stdout), sc)
}

// scheduleTable prints a page of schedules, then the next page's token.
func scheduleTable(w io.Writer, out *task.ScheduleList) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCHEDULE_ID\tCRON\tTIME_ZONE\tFAMILY\tNEXT_FIRE\tFIRES\tSKIPPED")
	for _, sc := range out.Schedules {
		next := "paused"
		if !sc.Paused {
			next = when(sc.NextFireAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", sc.ScheduleID, sc.Cron, sc.TimeZone, sc.Task.Family, next, sc.Fires, sc.SkippedFires)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if out.NextPageToken != "" {
		fmt.Fprintf(w, "\nnext page: --page-token %s\n", out.NextPageToken)
	}
	return nil
}

// showSchedule prints a schedule (get, pause, resume).
func showSchedule(w io.Writer, asJSON bool, sc *task.Schedule) error {
	inZone := func(t *time.Time) string {
		if t == nil {
			return ""
		}
		if loc, err := time.LoadLocation(sc.TimeZone); err == nil {
			return t.In(loc).Format(time.RFC3339)
		}
		return t.Format(time.RFC3339)
	}
	return show(w, asJSON, sc, [][2]string{
		{"schedule", sc.ScheduleID},
		{"cron", sc.Cron + " (" + sc.TimeZone + ")"},
		{"task", sc.Task.Family + "/" + sc.Task.Variant},
		{"subject key", sc.Task.SubjectKey},
		{"overlap", sc.Overlap},
		{"catch up", sc.CatchUp},
		{"paused", strconv.FormatBool(sc.Paused)},
		{"next fire", inZone(sc.NextFireAt)},
		{"last fire", inZone(sc.LastFireAt)},
		{"last task", sc.LastTaskID},
		{"fires", strconv.FormatInt(sc.Fires, 10)},
		{"skipped", strconv.FormatInt(sc.SkippedFires, 10)},
		{"last error", sc.LastError},
	}, "")
}
