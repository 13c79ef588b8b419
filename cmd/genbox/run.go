package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Exit codes: stable, documented in `genbox help`, for scripts to rely on.
const (
	exitOK          = 0 // done; with --wait, the task succeeded
	exitFailure     = 1 // the task ended other than succeeded, or an error not listed below
	exitUsage       = 2 // bad flags or arguments
	exitNotFound    = 3 // no such task, tenant, key or dead letter (404)
	exitAuth        = 4 // missing, wrong or revoked key (401, 403)
	exitUnavailable = 5 // server unreachable, 5xx, or 429 after retries
	exitRejected    = 6 // the request was refused (400, 409, 413, 422): the message says why
	exitTimeout     = 7 // --timeout passed before the task finished
)

// Environment variables of the CLI.
const (
	envURL         = "GENBOX_URL"
	envAPIKey      = "GENBOX_API_KEY"
	envAdminKey    = "GENBOX_ADMIN_KEY"
	envDLQURL      = "GENBOX_DLQ_URL"
	envCallbackURL = "GENBOX_CALLBACK_URL"
	defaultURL     = "http://127.0.0.1:8080"
	defaultDLQURL  = "http://127.0.0.1:8081"
)

// env is what every verb gets: its arguments, the environment and the standard streams.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// verb is one subcommand.
type verb struct {
	name    string
	summary string
	run     func(ctx context.Context, e env, args []string) error
}

func verbs() []verb {
	return []verb{
		{"dev", "run the whole stack locally: emulators, the four services, fake Gemini, Slack double, webhook listener", runDev},
		{"submit", "submit a task (JSON from a file or stdin, or flags); --wait follows it to the end", runSubmit},
		{"get", "show a task", runGet},
		{"list", "list your tenant's tasks, newest first", runList},
		{"cancel", "cancel a queued or waiting task", runCancel},
		{"schedule", "recurring schedules: create, list, get, pause, resume, delete", runSchedule},
		{"rerun", "re-run your finished tasks a filter matches (--dry-run: count them and estimate the cost); rerun status ID", runRerun},
		{"dlq", "dead letters: list, show, redeliver, regenerate, discard (the dlqnotifier's admin routes)", runDLQ},
		{"admin", "tenants, API keys and webhook secrets (admin key)", runAdmin},
		{"bench", "measure throughput, latency overhead, operations and billed tokens; --baseline naive side by side", runBench},
		{"fakegemini", "serve the fake Gemini API (set GOOGLE_GEMINI_BASE_URL to its URL)", runFakeGemini},
		{"webhook", "webhook listen: receive, verify and print webhooks", runWebhook},
	}
}

const exitCodesHelp = `Exit codes:
  0  ok (with --wait: the task succeeded)
  1  failure: the task ended failed, dead, cancelled or discarded, or another error
  2  usage: bad flags or arguments
  3  not found
  4  auth: missing, wrong or revoked key
  5  unavailable: genbox could not be reached, or answered 5xx/429 after retries
  6  rejected: the request was refused (invalid, conflicting); the message says why
  7  timeout: --timeout passed before the task finished
130  interrupted (Ctrl-C); a second Ctrl-C stops at once
`

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: genbox <verb> [flags] [args]\n\nVerbs:\n")
	for _, v := range verbs() {
		fmt.Fprintf(w, "  %-11s %s\n", v.name, v.summary)
	}
	fmt.Fprintf(w, "\nRun \"genbox <verb> --help\" for a verb's flags, \"genbox --version\" for this build.\nVerbs that print data print text; --json prints JSON instead.\n\nEnvironment:\n")
	for _, v := range [][2]string{
		{envURL, "the publisher's base URL (default " + defaultURL + ")"},
		{envAPIKey, "your tenant's API key (submit, get, list, cancel, schedule, rerun)"},
		{envAdminKey, "the admin key (admin, dlq)"},
		{envDLQURL, "the dlqnotifier's base URL (dlq; default " + defaultDLQURL + ")"},
		{envCallbackURL, "the callback_url of submissions that name none"},
	} {
		fmt.Fprintf(w, "  %-20s %s\n", v[0], v[1])
	}
	fmt.Fprintf(w, "\n%s", exitCodesHelp)
}

// run is the whole command: it dispatches args to a verb and maps its error to an exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version())
		return exitOK
	}
	for _, v := range verbs() {
		if v.name == args[0] {
			return exitCode(stderr, v.run(ctx, e, args[1:]))
		}
	}
	fmt.Fprintf(stderr, "genbox: unknown verb %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

// exitError carries an exit code chosen by a verb and the message to print ("" prints nothing).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func usageErr(format string, a ...any) error {
	return &exitError{code: exitUsage, msg: fmt.Sprintf(format, a...)}
}

// exitCode prints err with what to do about it and returns its exit code.
func exitCode(stderr io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	code, msg := classify(err)
	if msg != "" {
		fmt.Fprintln(stderr, "genbox: "+msg)
	}
	return code
}

func classify(err error) (int, string) {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, ee.msg
	}
	var p *task.Problem
	if errors.As(err, &p) {
		return problemCode(p), err.Error() + hint(p)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "listen" {
		// A verb that serves (dev, fakegemini, webhook listen) could not bind: it is the server,
		// so the hint below about reaching one would mislead.
		return exitFailure, err.Error()
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) {
		return exitUnavailable, err.Error() + " (is the server running? `genbox dev` starts one; set the URL with --url or " + envURL + ")"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return exitTimeout, err.Error()
	}
	return exitFailure, err.Error()
}

func problemCode(p *task.Problem) int {
	switch {
	case p.Status == http.StatusNotFound:
		return exitNotFound
	case p.Status == http.StatusUnauthorized || p.Status == http.StatusForbidden:
		return exitAuth
	case p.Status == http.StatusTooManyRequests || p.Status >= 500:
		return exitUnavailable
	case p.Status >= 400:
		return exitRejected
	}
	return exitFailure
}

func hint(p *task.Problem) string {
	switch {
	case p.Status == http.StatusUnauthorized || p.Status == http.StatusForbidden:
		return " (check the key: " + envAPIKey + " for tasks, " + envAdminKey + " for admin and dlq; `genbox dev` prints both)"
	case p.Status == http.StatusTooManyRequests:
		return " (rate limited: retry later, or raise the tenant's limits with `genbox admin tenant limits`)"
	case p.Status >= 500:
		return " (the server failed; retry, and check its logs)"
	}
	return ""
}

// newFlags returns a verb's FlagSet: errors go to stderr and --help prints synopsis, description
// and flags.
func newFlags(e env, name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet("genbox "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: genbox %s %s\n\n%s\n", name, synopsis, description)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nFlags:")
			printFlags(w, fs)
		}
	}
	return fs
}

// parse parses args, flags and positional arguments in any order (a lone "--" ends the flags),
// and returns the positional ones. --help is flag.ErrHelp (exit 0, usage printed on stdout), a
// bad flag a usage error (already printed by the FlagSet).
func parse(e env, fs *flag.FlagSet, args []string) ([]string, error) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(e.stdout)
			fs.Usage()
			return nil, flag.ErrHelp
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, &exitError{code: exitUsage}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if len(args) > 0 && args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// apiFlags are the connection flags of the verbs that call the publisher. A key flag has no
// default shown in --help: the key comes from the environment when the flag is not given.
type apiFlags struct {
	url, key string
	getenv   func(string) string
}

func (a *apiFlags) register(fs *flag.FlagSet, e env, keyEnv string) {
	a.getenv = e.getenv
	fs.StringVar(&a.url, "url", envOr(e.getenv, envURL, defaultURL), "the publisher's base URL ("+envURL+")")
	fs.StringVar(&a.key, "key", "", "the key to authenticate with (default $"+keyEnv+")")
}

func (a *apiFlags) client(keyEnv string) (*client.Client, error) {
	key := a.key
	if key == "" {
		key = a.getenv(keyEnv)
	}
	if key == "" {
		return nil, &exitError{code: exitAuth, msg: "no key: set " + keyEnv + " or pass --key (`genbox dev` prints the dev keys)"}
	}
	return newClient(a.url, envURL, key)
}

// newClient is the CLI's client of the server at rawURL (set by --url or urlEnv), with key: the
// publisher's, or the dlqnotifier's for the dlq verbs.
func newClient(rawURL, urlEnv, key string) (*client.Client, error) {
	if u, err := url.Parse(rawURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageErr("--url %q is not an http(s) URL (set --url or %s)", rawURL, urlEnv)
	}
	return client.New(rawURL, key, client.WithRetries(2), client.WithBackoff(200*time.Millisecond, 2*time.Second)), nil
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// oneArg returns the single positional argument a verb takes.
func oneArg(pos []string, verb, what string) (string, error) {
	if len(pos) != 1 {
		return "", usageErr("%s takes exactly one %s (see --help)", verb, what)
	}
	return pos[0], nil
}

// labelsFlag collects repeated --label key=value flags.
type labelsFlag map[string]string

func (l labelsFlag) String() string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k+"="+l[k])
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (l labelsFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not key=value", s)
	}
	l[k] = v
	return nil
}
