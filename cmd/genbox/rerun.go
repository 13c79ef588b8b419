package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func runRerun(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "rerun", "[flags] | rerun status RERUN_ID",
		`Re-runs your tenant's finished tasks that every given filter matches: each gets a new replay
under its variant's current prompt version (its earlier outcome kept in previous[]), paced by
the workers within your tenant's concurrency cap and budget. With --dry-run nothing runs: it
prints how many tasks match and what one more generation of them is estimated to cost. Without
it, it prints the re-run; "genbox rerun status RERUN_ID" shows its progress, and --wait follows
it until every task has run again.`)
	var api apiFlags
	api.register(fs, e, envAPIKey)
	dry := fs.Bool("dry-run", false, "count the matching tasks and estimate the cost; start nothing")
	state := fs.String("state", "", "only tasks in this state (succeeded, failed, dead, discarded)")
	family := fs.String("family", "", "only tasks of this family")
	variant := fs.String("variant", "", "only tasks of this variant")
	promptVersion := fs.String("prompt-version", "", "only tasks last run under this prompt version")
	after := fs.String("created-after", "", "only tasks created at or after this RFC 3339 time")
	before := fs.String("created-before", "", "only tasks created before this RFC 3339 time")
	labels := labelsFlag{}
	fs.Var(labels, "label", "only tasks with this label key=value (repeatable)")
	id := fs.String("rerun-id", "", "the re-run's id: asking again with it returns the same re-run (default: a fresh id)")
	wait := fs.Bool("wait", false, "follow the re-run until every task has run again")
	timeout := fs.Duration("timeout", time.Hour, "with --wait: give up after this long (exit 7)")
	interval := fs.Duration("interval", 2*time.Second, "with --wait: how often to read the progress")
	output := formatFlags(fs)
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	c, err := api.client(envAPIKey)
	if err != nil {
		return err
	}
	asJSON := output.asJSON(e.stdout)
	if len(pos) > 0 {
		if pos[0] != "status" {
			return usageErr("rerun takes flags, or \"status RERUN_ID\" (see --help)")
		}
		rid, err := oneArg(pos[1:], "rerun status", "re-run id")
		if err != nil {
			return err
		}
		return followRerun(ctx, e, c, rid, *wait, *timeout, *interval, asJSON)
	}
	f := task.RerunFilter{State: task.State(*state), Family: *family, Variant: *variant, PromptVersion: *promptVersion}
	if len(labels) > 0 {
		f.Labels = labels
	}
	for _, t := range []struct {
		flag, v string
		dst     **time.Time
	}{{"created-after", *after, &f.CreatedAfter}, {"created-before", *before, &f.CreatedBefore}} {
		if t.v == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339, t.v)
		if err != nil {
			return usageErr("--%s %q is not an RFC 3339 time", t.flag, t.v)
		}
		*t.dst = &at
	}
	r, err := c.Rerun(ctx, task.RerunRequest{Filter: f, DryRun: *dry, RerunID: *id})
	if err != nil {
		return fmt.Errorf("rerun: %w", err)
	}
	if *dry || !*wait {
		return showRerun(e.stdout, asJSON, r)
	}
	return followRerun(ctx, e, c, r.RerunID, true, *timeout, *interval, asJSON)
}

// followRerun prints re-run id; with wait, once it has completed, its progress on stderr as it
// moves.
func followRerun(ctx context.Context, e env, c *client.Client, id string, wait bool, timeout, interval time.Duration, asJSON bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		r, err := c.GetRerun(ctx, id)
		if err != nil {
			if ctx.Err() != nil && wait {
				return &exitError{code: exitTimeout, msg: fmt.Sprintf("re-run %s: not completed after %s", id, timeout)}
			}
			return fmt.Errorf("rerun status %s: %w", id, err)
		}
		if !wait || r.State == task.RerunCompleted {
			return showRerun(e.stdout, asJSON, r)
		}
		if s := rerunProgress(r); s != last {
			fmt.Fprintln(e.stderr, s)
			last = s
		}
		select {
		case <-ctx.Done():
			return &exitError{code: exitTimeout, msg: fmt.Sprintf("re-run %s: not completed after %s (%s)", id, timeout, last)}
		case <-time.After(interval):
		}
	}
}

func rerunProgress(r *task.Rerun) string {
	p := r.Progress
	if p == nil {
		return string(r.State)
	}
	return fmt.Sprintf("%s: %d of %d started, %d done, %d failed, %d skipped", r.State, p.Started, r.Count, p.Done, p.Failed, p.Skipped)
}

// showRerun prints a dry run's estimate or a re-run.
func showRerun(w io.Writer, asJSON bool, r *task.Rerun) error {
	dry := ""
	if r.DryRun {
		dry = "true: nothing was started"
	}
	rows := [][2]string{
		{"rerun_id", r.RerunID},
		{"dry_run", dry},
		{"state", string(r.State)},
		{"count", strconv.Itoa(r.Count)},
		{"estimated_cost", fmt.Sprintf("$%.6f", r.EstimatedCostUSD)},
		{"created", when(r.CreatedAt)},
		{"completed", when(r.CompletedAt)},
	}
	if r.Progress != nil {
		rows = append(rows, [2]string{"progress", rerunProgress(r)})
	}
	return show(w, asJSON, r, rows, "")
}
