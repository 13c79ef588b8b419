package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func runSubmit(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "submit", "[flags] [--file request.json | -]",
		`Submits one task and prints its id. The request is JSON (the body of POST /v1/tasks) read from
--file (- for stdin), or built from --family and --input; flags given with a file override its
fields. Without --file and --family, the request is read from stdin. Each --attach uploads a
file (PDF, image, audio, video; its type from its extension) and names it in the request's files.
With --wait, follows the task's events (progress on stderr; polling when the event stream is
unavailable) until it ends and its webhook is settled; with --stream also the text generated so
far, on stderr. Then it prints the task on stdout, and exits 0 if it succeeded, 1 otherwise, 7 on --timeout
(which counts from the submission: a task delayed with --delay or --start-after waits that long first). With
--json, prints the answer to the submission (without --wait) as JSON; with --wait the task is
printed as JSON when stdout is not a terminal (--json, --text choose).`)
	var api apiFlags
	api.register(fs, e, envAPIKey)
	file := fs.String("file", "", "read the JSON request from this file (- for stdin)")
	family := fs.String("family", "", "the prompt family (e.g. summarize, classify, analyze)")
	variant := fs.String("variant", "", "the family's variant")
	input := fs.String("input", "", "the text to work on")
	inputFile := fs.String("input-file", "", "read the input text from this file (- for stdin)")
	callback := fs.String("callback-url", e.getenv(envCallbackURL), "where the signed webhook goes ("+envCallbackURL+")")
	subject := fs.String("subject-key", "", "what a stale fallback is keyed by")
	cache := fs.Bool("cache", false, "reuse an identical earlier generation of your tenant")
	mode := fs.String("mode", "", "standard (at once), flex (Flex tier: about half the price, minutes) or batch (Batch API: about half the price, within 24 h); default the family's")
	delay := fs.String("delay", "", `start the task no sooner than this from now, a duration such as "90s" or "2h" (at most 720h)`)
	startAfter := fs.String("start-after", "", "start the task no sooner than this RFC 3339 time (at most 30 days ahead)")
	labels := labelsFlag{}
	fs.Var(labels, "label", "a label key=value (repeatable)")
	var attach pathsFlag
	fs.Var(&attach, "attach", "upload this file and add it to the task's files (repeatable; e.g. --family extract --attach invoice.pdf)")
	idemKey := fs.String("idempotency-key", "", "the intent's key: submitting again with it returns the same task (default: a fresh key)")
	wait := fs.Bool("wait", false, "follow the task until it ends; exit by its final state")
	timeout := fs.Duration("timeout", 10*time.Minute, "with --wait: give up after this long (exit 7)")
	interval := fs.Duration("interval", 250*time.Millisecond, "with --wait: how often to poll when the event stream is unavailable")
	stream := fs.Bool("stream", false, "stream the generation and, with --wait, print the text so far on stderr as it comes (never the stored output)")
	output := formatFlags(fs)
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 1 && pos[0] == "-" && *file == "" {
		*file = "-"
	} else if len(pos) > 0 {
		return usageErr("submit takes no arguments besides --file (see --help)")
	}
	req, err := buildRequest(e, *file, *family, *input, *inputFile)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *variant != "" {
		req.Variant = *variant
	}
	if *callback != "" && (set["callback-url"] || req.CallbackURL == "") {
		req.CallbackURL = *callback
	}
	if *subject != "" {
		req.SubjectKey = *subject
	}
	if set["cache"] {
		req.Cache = *cache
	}
	if set["stream"] {
		req.Stream = *stream
	}
	if *mode != "" {
		req.Mode = task.Mode(*mode)
		if !req.Mode.Valid() {
			return usageErr("--mode %q: want one of %v", *mode, task.Modes)
		}
	}
	if err := setStart(&req, *delay, *startAfter); err != nil {
		return err
	}
	for k, v := range labels {
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[k] = v
	}
	if req.Family == "" || req.Input == "" && len(req.Files) == 0 && len(attach) == 0 {
		return usageErr("a request needs a family and an input: pass --family and --input (or --input-file, or --attach for a family that reads files), or a JSON request with --file")
	}
	c, err := api.client(envAPIKey)
	if err != nil {
		return err
	}
	for _, path := range attach {
		f, err := c.UploadFile(ctx, path)
		if err != nil {
			return fmt.Errorf("attach %s: %w", path, err)
		}
		req.Files = append(req.Files, f)
	}
	if *idemKey == "" {
		*idemKey = client.NewIdempotencyKey()
	}
	res, err := c.SubmitWithKey(ctx, *idemKey, req)
	if err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	if !*wait {
		if *output.json {
			return printJSON(e.stdout, res)
		}
		fmt.Fprintln(e.stdout, res.TaskID)
		return nil
	}
	replayed := ""
	if res.Replayed {
		replayed = " (an earlier submission with this idempotency key)"
	}
	fmt.Fprintf(e.stderr, "task %s %s%s\n", res.TaskID, res.State, replayed)
	return follow(ctx, e, c, res.TaskID, followOptions{timeout: *timeout, interval: *interval, asJSON: output.asJSON(e.stdout), stream: *stream})
}

// pathsFlag is a repeatable flag of file paths.
type pathsFlag []string

func (p *pathsFlag) String() string { return strings.Join(*p, ",") }

func (p *pathsFlag) Set(s string) error {
	if s == "" {
		return errors.New("an empty path")
	}
	*p = append(*p, s)
	return nil
}

// buildRequest reads the request from file, or builds it from the flags, or reads it from stdin.
func buildRequest(e env, file, family, input, inputFile string) (task.Request, error) {
	var req task.Request
	if file != "" || family == "" {
		var data []byte
		var err error
		switch file {
		case "", "-":
			data, err = io.ReadAll(io.LimitReader(e.stdin, 8<<20))
		default:
			data, err = os.ReadFile(file)
		}
		if err != nil {
			return req, usageErr("read the request: %v", err)
		}
		if len(bytes.TrimSpace(data)) == 0 {
			return req, usageErr("no request: pass --family and --input, or a JSON request with --file or on stdin")
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return req, usageErr("the request is not a valid task request: %v (fields: family, variant, input, subject_key, callback_url, config, labels, cache, run_before, max_cost_usd, mode, stream, files)", err)
		}
	}
	if family != "" {
		req.Family = family
	}
	if input != "" && inputFile != "" {
		return req, usageErr("pass --input or --input-file, not both")
	}
	if input != "" {
		req.Input = input
	}
	if inputFile != "" {
		var data []byte
		var err error
		if inputFile == "-" {
			data, err = io.ReadAll(io.LimitReader(e.stdin, 8<<20))
		} else {
			data, err = os.ReadFile(inputFile)
		}
		if err != nil {
			return req, usageErr("read --input-file: %v", err)
		}
		req.Input = string(data)
	}
	return req, nil
}

// follow watches a task (GET /v1/tasks/{id}/events, falling back to polling every interval when
// the stream fails) until it ends and its webhook is settled, printing every change on stderr —
// and, with stream, the text generated so far — then prints the task on stdout (as JSON with
// asJSON) and returns nil only if it succeeded.
func follow(ctx context.Context, e env, c *client.Client, id string, o followOptions) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	start := time.Now()
	var last string
	show := func(v *task.View) {
		if s := progress(v); s != last {
			fmt.Fprintf(e.stderr, "%6.1fs  %s\n", time.Since(start).Seconds(), s)
			last = s
		}
	}
	var final, seen *task.View
	preview := ""
	err := c.Watch(ctx, id, func(ev task.StreamEvent) error {
		if ev.Type == task.EventPreview {
			if o.stream {
				printPreview(e.stderr, preview, ev.Preview)
				preview = ev.Preview
			}
			return nil
		}
		show(ev.Task)
		seen = ev.Task
		if ev.Final() {
			final = ev.Task
		}
		return nil
	})
	if preview != "" {
		fmt.Fprintln(e.stderr)
	}
	switch {
	case final != nil:
	case ctx.Err() != nil:
		return timedOut(ctx, id, seen, o.timeout)
	default:
		fmt.Fprintf(e.stderr, "genbox: the event stream failed (%v); polling every %s\n", err, o.interval)
		if final, err = poll(ctx, c, id, o.interval, show); err != nil {
			return err
		}
	}
	if err := showTask(e.stdout, o.asJSON, final); err != nil {
		return err
	}
	if final.State != task.StateSucceeded {
		msg := fmt.Sprintf("task %s ended %s", id, final.State)
		if final.Error != nil {
			msg += ": " + string(final.Error.Kind) + ": " + final.Error.Message
		}
		return &exitError{code: exitFailure, msg: msg}
	}
	return nil
}

// followOptions are --wait's settings.
type followOptions struct {
	timeout, interval time.Duration
	asJSON, stream    bool
}

// poll reads the task every interval until it ends and its webhook is settled.
func poll(ctx context.Context, c *client.Client, id string, interval time.Duration, show func(*task.View)) (*task.View, error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var v *task.View
	for {
		got, err := c.Get(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return nil, timedOut(ctx, id, v, 0)
			}
			return nil, err
		}
		v = got
		show(v)
		if v.State.Finished() && v.Delivery.State != task.DeliveryPending {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return nil, timedOut(ctx, id, v, 0)
		case <-tick.C:
		}
	}
}

// timedOut is the error of a --wait that ctx ended: exit 7 on its timeout.
func timedOut(ctx context.Context, id string, v *task.View, timeout time.Duration) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ctx.Err()
	}
	after := ""
	if timeout > 0 {
		after = " after " + timeout.String()
	}
	if v == nil {
		return &exitError{code: exitTimeout, msg: fmt.Sprintf("task %s not finished%s (it goes on: `genbox get %s`)", id, after, id)}
	}
	return &exitError{code: exitTimeout, msg: fmt.Sprintf("task %s is still %s%s (it goes on: `genbox get %s`)", id, v.State, after, id)}
}

// printPreview prints what a preview adds to the one before it (all of it, on a new line, when
// it does not continue it: a new attempt began).
func printPreview(w io.Writer, before, now string) {
	if rest, ok := strings.CutPrefix(now, before); ok {
		fmt.Fprint(w, rest)
		return
	}
	fmt.Fprint(w, "\n"+now)
}

// progress is one line of --wait's progress.
func progress(v *task.View) string {
	var b strings.Builder
	b.WriteString(string(v.State))
	if v.Mode != "" && v.Mode != task.ModeStandard {
		b.WriteString(" mode=" + string(v.Mode))
	}
	if v.BatchJob != "" {
		b.WriteString(" batch_job=" + v.BatchJob)
	}
	if v.Model != "" {
		b.WriteString(" model=" + v.Model)
	}
	if v.Degraded {
		b.WriteString(" degraded")
	}
	if v.State.Finished() && v.Delivery.State != "" && v.Delivery.State != task.DeliveryNone {
		fmt.Fprintf(&b, " webhook=%s", v.Delivery.State)
		if v.Delivery.Attempts > 0 {
			fmt.Fprintf(&b, " (attempts %d)", v.Delivery.Attempts)
		}
	}
	if v.Error != nil {
		fmt.Fprintf(&b, " error=%s", v.Error.Kind)
	}
	return b.String()
}

func runGet(ctx context.Context, e env, args []string) error {
	return taskVerb(ctx, e, args, "get", "Prints the task as the API shows it: its fields, then its output; JSON, as the API answers, when stdout is not a terminal (--json, --text choose).", (*client.Client).Get)
}

// taskVerb is a verb that takes one task id, calls the API with it and prints the task.
func taskVerb(ctx context.Context, e env, args []string, name, description string,
	call func(c *client.Client, ctx context.Context, id string) (*task.View, error)) error {
	fs := newFlags(e, name, "[flags] TASK_ID", description)
	var api apiFlags
	api.register(fs, e, envAPIKey)
	output := formatFlags(fs)
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	id, err := oneArg(pos, name, "task id")
	if err != nil {
		return err
	}
	c, err := api.client(envAPIKey)
	if err != nil {
		return err
	}
	v, err := call(c, ctx, id)
	if err != nil {
		return fmt.Errorf("%s %s: %w", name, id, err)
	}
	return showTask(e.stdout, output.asJSON(e.stdout), v)
}

func runList(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "list", "[flags]", "Lists your tenant's tasks, newest first: one page, or every page with --all.")
	var api apiFlags
	api.register(fs, e, envAPIKey)
	state := fs.String("state", "", "only tasks in this state ("+statesList()+")")
	limit := fs.Int("limit", 20, "tasks per page")
	page := fs.String("page-token", "", "the page to show (printed after a page)")
	all := fs.Bool("all", false, "every page")
	asJSON := fs.Bool("json", false, "print JSON (one page as the API answers it; with --all, one task per line)")
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("list takes no arguments (see --help)")
	}
	if *state != "" && !task.State(*state).Valid() {
		return usageErr("--state %q is not one of %s", *state, statesList())
	}
	c, err := api.client(envAPIKey)
	if err != nil {
		return err
	}
	o := client.ListOptions{State: task.State(*state), Limit: *limit, PageToken: *page}
	if *all {
		tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
		if !*asJSON {
			fmt.Fprintln(tw, "TASK_ID\tSTATE\tFAMILY\tWEBHOOK\tCREATED")
		}
		for v, err := range c.All(ctx, o) {
			if err != nil {
				tw.Flush()
				return fmt.Errorf("list: %w", err)
			}
			if *asJSON {
				b, _ := json.Marshal(v)
				fmt.Fprintln(tw, string(b))
				continue
			}
			listRow(tw, v)
		}
		return tw.Flush()
	}
	l, err := c.List(ctx, o)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if *asJSON {
		return printJSON(e.stdout, l)
	}
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK_ID\tSTATE\tFAMILY\tWEBHOOK\tCREATED")
	for _, v := range l.Tasks {
		listRow(tw, v)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l.NextPageToken != "" {
		fmt.Fprintf(e.stderr, "more: genbox list --page-token %s\n", l.NextPageToken)
	}
	return nil
}

func listRow(w io.Writer, v task.View) {
	fam := v.Family
	if v.Variant != "" {
		fam += "/" + v.Variant
	}
	hook := string(v.Delivery.State)
	if hook == "" {
		hook = "-"
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", v.TaskID, v.State, fam, hook, v.CreatedAt.Local().Format(time.DateTime))
}

func statesList() string {
	s := make([]string, len(task.States))
	for i, st := range task.States {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func runCancel(ctx context.Context, e env, args []string) error {
	return taskVerb(ctx, e, args, "cancel",
		"Cancels a queued or waiting task and prints it; a running or finished task cannot be cancelled (exit 6).",
		(*client.Client).Cancel)
}
