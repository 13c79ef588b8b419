package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) {
	code := emulator.RunTests(m)
	cliBuild.Remove()
	os.Exit(code)
}

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

// cli runs the command in-process with env as its whole environment.
func cli(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb testenv.LogBuffer
	code := run(ctx, args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// Usage errors, help and the exit codes that need no server.
func TestUsageAndExitCodes(t *testing.T) {
	t.Parallel()
	noServer := map[string]string{envURL: "http://127.0.0.1:1", envAPIKey: "k-0123456789abcdef", envAdminKey: "a-0123456789abcdef", envDLQURL: "http://127.0.0.1:1"}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		stdin  string
		args   []string
		code   int
		stdout string // substring expected on stdout
		stderr string // substring expected on stderr
	}{
		{"no verb", nil, "", nil, exitUsage, "", "Usage: genbox"},
		{"help", nil, "", []string{"help"}, exitOK, "Exit codes:", ""},
		{"unknown verb", nil, "", []string{"frobnicate"}, exitUsage, "", `unknown verb "frobnicate"`},
		{"verb help", nil, "", []string{"submit", "--help"}, exitOK, "Usage: genbox submit", ""},
		{"every verb has help", nil, "", []string{"dlq", "-h"}, exitOK, "Usage: genbox dlq", ""},
		{"webhook help", nil, "", []string{"webhook", "--help"}, exitOK, "Usage: genbox webhook listen", ""},
		{"bad flag", nil, "", []string{"get", "--nope", "x"}, exitUsage, "", "flag provided but not defined"},
		{"get without id", noServer, "", []string{"get"}, exitUsage, "", "exactly one task id"},
		{"no key", map[string]string{}, "", []string{"get", "t1"}, exitAuth, "", "set GENBOX_API_KEY"},
		{"no admin key", map[string]string{}, "", []string{"dlq", "list"}, exitAuth, "", "GENBOX_ADMIN_KEY"},
		{"empty request", noServer, "", []string{"submit"}, exitUsage, "", "no request"},
		{"request not JSON", noServer, "{nope", []string{"submit"}, exitUsage, "", "not a valid task request"},
		{"unknown request field", noServer, `{"family":"summarize","input":"x","colour":1}`, []string{"submit"}, exitUsage, "", "colour"},
		{"bad state", noServer, "", []string{"list", "--state", "sleeping"}, exitUsage, "", "is not one of"},
		{"bad mode", noServer, "", []string{"submit", "--family", "summarize", "--input", "x", "--mode", "eventually"}, exitUsage, "", "--mode"},
		{"bad delay", noServer, "", []string{"submit", "--family", "summarize", "--input", "x", "--delay", "soon"}, exitUsage, "", "--delay"},
		{"negative delay", noServer, "", []string{"submit", "--family", "summarize", "--input", "x", "--delay", "-5s"}, exitUsage, "", "--delay"},
		{"bad start-after", noServer, "", []string{"submit", "--family", "summarize", "--input", "x", "--start-after", "tomorrow"}, exitUsage, "", "--start-after"},
		{"delay and start-after", noServer, "", []string{"submit", "--family", "summarize", "--input", "x", "--delay", "1h", "--start-after", "2030-01-01T00:00:00Z"}, exitUsage, "", "exclude each other"},
		{"bad url", map[string]string{envAPIKey: "k-0123456789abcdef", envURL: "ftp://x"}, "", []string{"get", "t1"}, exitUsage, "", "not an http(s) URL"},
		{"unreachable", noServer, "", []string{"get", "t1"}, exitUnavailable, "", "is the server running?"},
		{"dlq unreachable", noServer, "", []string{"dlq", "show", "t:generation:0:0"}, exitUnavailable, "", "is the server running?"},
		{"admin needs three words", noServer, "", []string{"admin", "tenant", "create"}, exitUsage, "", "admin takes an object"},
		{"admin unknown action", noServer, "", []string{"admin", "tenant", "eat", "x"}, exitUsage, "", "unknown admin action"},
		{"bench bad flag value", nil, "", []string{"bench", "--tasks", "0"}, exitUsage, "", "--tasks"},
		{"version", nil, "", []string{"--version"}, exitOK, "genbox ", ""},
		{"version names the Go release", nil, "", []string{"version"}, exitOK, runtime.Version(), ""},
		{"help spells flags as the prose does", nil, "", []string{"submit", "--help"}, exitOK, "\n  --wait\n", ""},
		{"help shows a flag's type and default", nil, "", []string{"submit", "--help"}, exitOK, "  --timeout duration\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := cli(t, tc.env, tc.stdin, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, tc.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stdout, tc.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tc.stdout, r.stdout)
			}
			if !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderr, r.stderr)
			}
		})
	}
}

// Every verb's help spells its flags as the documentation does, --name, never -name.
func TestHelpSpellsFlagsWithTwoDashes(t *testing.T) {
	t.Parallel()
	for _, v := range verbs() {
		r := cli(t, nil, "", v.name, "--help")
		if r.code != exitOK || !strings.Contains(r.stdout, "Flags:") {
			t.Errorf("%s --help: exit %d\n%s%s", v.name, r.code, r.stdout, r.stderr)
			continue
		}
		for line := range strings.Lines(r.stdout) {
			if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
				t.Errorf("%s --help spells a flag with one dash: %q", v.name, line)
			}
		}
	}
}

// startStack runs a dev stack of the test's own project in-process on free ports.
func startStack(t *testing.T, extra ...string) *devstack.Stack {
	t.Helper()
	return devstack.StartTest(t, nil, extra...)
}

// cliEnv is the environment `genbox dev` tells the user to export.
func cliEnv(s *devstack.Stack) map[string]string {
	return map[string]string{envURL: s.Info.Publisher, envAPIKey: s.Info.APIKey, envAdminKey: s.Info.AdminKey,
		envDLQURL: s.Info.DLQ, envCallbackURL: s.Info.WebhookURL}
}

// The task verbs against a running stack: submit --wait ends in a verified webhook and exits 0;
// get, list and cancel answer with the documented exit codes.
func TestTaskVerbs(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	env := cliEnv(s)

	r := cli(t, env, "", "submit", "--family", "summarize", "--input", "genbox never pays twice.", "--label", "app=cli", "--wait", "--json")
	if r.code != exitOK {
		t.Fatalf("submit --wait exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var v task.View
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("submit --wait printed no task: %v\n%s", err, r.stdout)
	}
	if v.State != task.StateSucceeded || v.Delivery.State != task.DeliveryDelivered || v.Labels["app"] != "cli" {
		t.Errorf("submit --wait ended with %+v", v)
	}
	if !strings.Contains(r.stderr, "succeeded") {
		t.Errorf("no progress on stderr:\n%s", r.stderr)
	}
	want := task.EventID(v.TaskID, task.EventSucceeded, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.ID == want }); err != nil {
		t.Fatalf("webhook %s not received: %v", want, err)
	}

	// A JSON request on stdin; without --wait the task id is printed.
	r = cli(t, env, `{"family":"summarize","input":"from stdin"}`, "submit")
	id := strings.TrimSpace(r.stdout)
	if r.code != exitOK || id == "" {
		t.Fatalf("submit from stdin: exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"get", env, []string{"get", "--text", v.TaskID}, exitOK, "state      succeeded", ""},
		// Scripts read get through a pipe: without --text it is the JSON they always had.
		{"get piped is json", env, []string{"get", v.TaskID}, exitOK, `"state": "succeeded"`, ""},
		{"get text ends with the output", env, []string{"get", "--text", v.TaskID}, exitOK, "\n\n" + *v.Output + "\n", ""},
		{"get json", env, []string{"get", "--json", v.TaskID}, exitOK, `"state": "succeeded"`, ""},
		{"submit json", env, []string{"submit", "--family", "summarize", "--input", "as JSON", "--json"}, exitOK, `"status_url": "http`, ""},
		{"get unknown", env, []string{"get", "nosuchtask"}, exitNotFound, "", "404"},
		{"wrong key", map[string]string{envURL: env[envURL], envAPIKey: "gbx_wrong_0123456789abcdef"}, []string{"get", v.TaskID}, exitAuth, "", "check the key"},
		{"list", env, []string{"list"}, exitOK, v.TaskID, ""},
		{"list json by state", env, []string{"list", "--state", "succeeded", "--json"}, exitOK, v.TaskID, ""},
		{"list all", env, []string{"list", "--all", "--limit", "1"}, exitOK, v.TaskID, ""},
		{"cancel finished", env, []string{"cancel", v.TaskID}, exitRejected, "", "409"},
		{"unknown family", env, []string{"submit", "--family", "nosuch", "--input", "x"}, exitRejected, "", "family"},
		{"submit delayed", env, []string{"submit", "--family", "summarize", "--input", "later", "--delay", "1h", "--json"}, exitOK, `"state": "scheduled"`, ""},
		{"submit delayed beyond 30 days", env, []string{"submit", "--family", "summarize", "--input", "later", "--start-after", time.Now().Add(31 * 24 * time.Hour).Format(time.RFC3339)}, exitRejected, "", "start_after"},
		{"replayed key", env, []string{"submit", "--family", "summarize", "--input", "genbox never pays twice.", "--idempotency-key", "k1"}, exitOK, "", ""},
	} {
		r := cli(t, tc.env, "", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
			t.Errorf("%s: exit %d (want %d)\nstdout: %s\nstderr: %s", tc.name, r.code, tc.code, r.stdout, r.stderr)
		}
	}
}

// --wait exits by the task's final state: 1 for a failed task (the model refused it), 7 when
// --timeout passes first.
func TestWaitExitCodes(t *testing.T) {
	t.Parallel()
	s := startStack(t, "GENBOX_MODEL_CHAIN", "m-wait")
	env := cliEnv(s)
	s.Fake.FailNext("m-wait", 400)
	r := cli(t, env, "", "submit", "--family", "summarize", "--input", "refused", "--wait")
	if r.code != exitFailure || !strings.Contains(r.stderr, "ended failed") {
		t.Errorf("a failed task: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	gate := s.Fake.Block("m-wait")
	defer gate.Release()
	r = cli(t, env, "", "submit", "--family", "summarize", "--input", "held", "--wait", "--timeout", "500ms")
	if r.code != exitTimeout || !strings.Contains(r.stderr, "genbox get") {
		t.Errorf("a held task with --timeout: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// admin manages tenants, keys and secrets: a created key submits, a revoked one is refused.
func TestAdminVerbs(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	env := cliEnv(s)
	r := cli(t, env, "", "admin", "tenant", "create", "acme", "--concurrency", "3", "--weight", "2", "--text")
	if r.code != exitOK || !strings.Contains(r.stdout, "whsec_") || !strings.Contains(r.stdout, "(shown once: keep it)") ||
		!strings.Contains(r.stdout, "concurrency 3, ") || !strings.Contains(r.stdout, ", weight 2") {
		t.Fatalf("tenant create: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r = cli(t, env, "", "admin", "tenant", "create", "acme"); r.code != exitRejected {
		t.Errorf("a second tenant create: exit %d, want %d\n%s", r.code, exitRejected, r.stderr)
	}
	if r = cli(t, env, "", "admin", "--submit-rate", "7", "tenant", "limits", "acme", "--json"); r.code != exitOK || !strings.Contains(r.stdout, `"submit_rate": 7`) {
		t.Errorf("tenant limits: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = cli(t, env, "", "admin", "key", "create", "acme", "--json")
	var key struct {
		KeyID string `json:"key_id"`
		Key   string `json:"key"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &key); err != nil || key.Key == "" {
		t.Fatalf("key create: exit %d %v\n%s\n%s", r.code, err, r.stdout, r.stderr)
	}
	acme := map[string]string{envURL: env[envURL], envAPIKey: key.Key}
	if r = cli(t, acme, "", "list"); r.code != exitOK {
		t.Errorf("list with the new key: exit %d\n%s", r.code, r.stderr)
	}
	if r = cli(t, env, "", "admin", "secret", "rotate", "acme", "--text"); r.code != exitOK || !strings.Contains(r.stdout, "earlier secrets sign until") {
		t.Errorf("secret rotate: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r = cli(t, env, "", "admin", "key", "revoke", key.KeyID); r.code != exitOK {
		t.Errorf("key revoke: exit %d\n%s", r.code, r.stderr)
	}
	if r = cli(t, acme, "", "list"); r.code != exitAuth {
		t.Errorf("list with a revoked key: exit %d, want %d\n%s", r.code, exitAuth, r.stderr)
	}
	if r = cli(t, env, "", "admin", "tenant", "get", "nosuch"); r.code != exitNotFound {
		t.Errorf("tenant get unknown: exit %d, want %d", r.code, exitNotFound)
	}
}

// dlq lists a dead generation, shows it, regenerates it (the task then succeeds) and answers a
// second decision as a conflict naming who decided: the admin key, with the name it gave.
func TestDLQVerbs(t *testing.T) {
	t.Parallel()
	s := startStack(t, "GENBOX_TASK_ATTEMPTS", "1", "GENBOX_MAX_ATTEMPTS", "1", "GENBOX_MODEL_CHAIN", "m-dlq")
	env := cliEnv(s)
	s.Fake.FailNext("m-dlq", 503)
	r := cli(t, env, "", "submit", "--family", "summarize", "--input", "dies once", "--wait", "--json")
	if r.code != exitFailure || !strings.Contains(r.stderr, "ended dead") {
		t.Fatalf("a task that dies: exit %d\n%s", r.code, r.stderr)
	}
	var v task.View
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatal(err)
	}
	dl := protocol.DeadLetterID(v.TaskID, task.StageGeneration, 0, 0)
	deadline := time.Now().Add(30 * time.Second)
	for r = cli(t, env, "", "dlq", "list"); !strings.Contains(r.stdout, dl); r = cli(t, env, "", "dlq", "list") {
		if r.code != exitOK || time.Now().After(deadline) {
			t.Fatalf("dlq list: exit %d, no %s\n%s\n%s", r.code, dl, r.stdout, r.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r = cli(t, env, "", "dlq", "show", dl, "--json"); r.code != exitOK || !strings.Contains(r.stdout, `"state": "open"`) {
		t.Errorf("dlq show --json: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r = cli(t, env, "", "dlq", "show", dl, "--text"); r.code != exitOK || !strings.Contains(r.stdout, "state        open") {
		t.Errorf("dlq show: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r = cli(t, env, "", "dlq", "redeliver", dl, "--operator", "ops"); r.code != exitRejected {
		t.Errorf("redeliver of a generation: exit %d, want %d\n%s", r.code, exitRejected, r.stderr)
	}
	if r = cli(t, env, "", "dlq", "regenerate", dl, "--operator", "ops"); r.code != exitOK || !strings.Contains(r.stdout, "regenerated") {
		t.Fatalf("dlq regenerate: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r = cli(t, env, "", "dlq", "discard", dl, "--operator", "someone"); r.code != exitRejected || !strings.Contains(r.stderr, `already decided by admin key `) || !strings.Contains(r.stderr, `(says "ops")`) {
		t.Errorf("a second decision: exit %d, want %d\n%s", r.code, exitRejected, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want := task.EventID(v.TaskID, task.EventSucceeded, 1)
	if _, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.ID == want }); err != nil {
		t.Fatalf("no %s webhook after regenerate: %v", want, err)
	}
	if r = cli(t, env, "", "dlq", "show", "nosuch:generation:0:0"); r.code != exitNotFound {
		t.Errorf("dlq show unknown: exit %d, want %d\n%s", r.code, exitNotFound, r.stderr)
	}
}

// rerun against a running stack: --dry-run counts and prices the matching tasks, a re-run
// followed with --wait ends with each of them run again, status shows it, and a filter the API
// refuses exits 6.
func TestRerunVerb(t *testing.T) {
	t.Parallel()
	s := startStack(t, "GENBOX_RERUN_INTERVAL", "100ms")
	env := cliEnv(s)
	for i := range 3 {
		if r := cli(t, env, "", "submit", "--family", "summarize", "--input", fmt.Sprintf("re-run %d", i), "--label", "app=rerun", "--wait"); r.code != exitOK {
			t.Fatalf("submit exit %d\n%s", r.code, r.stderr)
		}
	}
	r := cli(t, env, "", "rerun", "--dry-run", "--label", "app=rerun", "--family", "summarize", "--json")
	var dry task.Rerun
	if err := json.Unmarshal([]byte(r.stdout), &dry); r.code != exitOK || err != nil || dry.Count != 3 || !dry.DryRun || dry.EstimatedCostUSD <= 0 {
		t.Fatalf("rerun --dry-run: exit %d, %+v (%v), want a count of 3 and an estimate\n%s", r.code, dry, err, r.stderr)
	}
	r = cli(t, env, "", "rerun", "--label", "app=rerun", "--wait", "--interval", "100ms", "--json")
	var done task.Rerun
	if err := json.Unmarshal([]byte(r.stdout), &done); r.code != exitOK || err != nil || done.State != task.RerunCompleted ||
		done.Progress == nil || done.Progress.Started != 3 || done.Progress.Done != 3 {
		t.Fatalf("rerun --wait: exit %d, %+v (%v), want completed with 3 done\n%s", r.code, done, err, r.stderr)
	}
	if r := cli(t, env, "", "rerun", "status", done.RerunID, "--text"); r.code != exitOK || !strings.Contains(r.stdout, "completed: 3 of 3 started, 3 done") {
		t.Fatalf("rerun status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, env, "", "rerun", "--state", "queued"); r.code != exitRejected || !strings.Contains(r.stderr, "filter.state") {
		t.Fatalf("rerun --state queued: exit %d, want %d naming filter.state\n%s", r.code, exitRejected, r.stderr)
	}
	if r := cli(t, env, "", "rerun", "status", "no-such-rerun"); r.code != exitNotFound {
		t.Fatalf("rerun status of an unknown id: exit %d, want %d\n%s", r.code, exitNotFound, r.stderr)
	}
}
