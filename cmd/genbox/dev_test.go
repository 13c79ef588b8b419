package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
)

// The README's path on a fresh machine: the built `genbox dev` starts its own emulators and writes
// --ready-file; `genbox submit --wait` of a demo task exits 0 and the dev tenant's listener prints
// the verified webhook; SIGTERM stops everything and leaves no emulator JVM it started running.
func TestDevBinary(t *testing.T) {
	emulator.SkipWithoutJava(t) // it starts its own emulator JVMs
	t.Parallel()
	dir := t.TempDir()
	bin := genboxBinary(t)
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == emulator.FirestoreHostEnv || name == emulator.PubSubHostEnv || strings.HasPrefix(name, "GENBOX_") || name == "GEMINI_API_KEY" {
			continue // a fresh machine: nothing running, nothing configured
		}
		env = append(env, kv)
	}
	env = append(env, "GOOGLE_CLOUD_PROJECT=t-dev-binary") // its own emulators: no other test's documents
	ready := filepath.Join(dir, "ready.json")
	dev := exec.Command(bin, "dev", "--addr", "127.0.0.1:0", "--dlq-addr", "127.0.0.1:0", "--slack-addr", "127.0.0.1:0",
		"--webhook-addr", "127.0.0.1:0", "--gemini-addr", "127.0.0.1:0", "--ready-file", ready)
	dev.Env = env
	var devOut, devErr testenv.LogBuffer
	dev.Stdout, dev.Stderr = &devOut, &devErr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	t.Cleanup(func() {
		if dev.ProcessState == nil {
			_ = dev.Process.Kill()
		}
	})

	var info devstack.Info
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if data, err := os.ReadFile(ready); err == nil {
			if err := json.Unmarshal(data, &info); err != nil {
				t.Fatalf("ready file: %v\n%s", err, data)
			}
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("genbox dev exited before it was ready: %v\n%s\n%s", err, devOut.String(), devErr.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("genbox dev not ready\n%s\n%s", devOut.String(), devErr.String())
		}
	}
	var raw map[string]any
	data, _ := os.ReadFile(ready)
	_ = json.Unmarshal(data, &raw)
	for _, k := range []string{"publisher", "slack_interactions", "slack_console", "webhook_listener", "fake_gemini", "api_key", "webhook_url"} {
		if s, _ := raw[k].(string); s == "" {
			t.Errorf("ready file lacks %q: %s", k, data)
		}
	}
	if !info.EmulatorsStarted {
		t.Fatalf("genbox dev reused emulators although none were named:\n%s", data)
	}
	if !strings.Contains(devOut.String(), readyLine) {
		t.Errorf("no ready line:\n%s", devOut.String())
	}
	jvms := emulatorPIDs(t, info.FirestoreHost, info.PubSubHost)
	if len(jvms) < 2 {
		t.Fatalf("found %d emulator processes for %s and %s, want both", len(jvms), info.FirestoreHost, info.PubSubHost)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	submit := exec.CommandContext(ctx, bin, "submit", "--family", "summarize", "--input", "genbox runs Gemini tasks and never pays twice.", "--wait", "--text")
	submit.Env = append(env, envURL+"="+info.Publisher, envAPIKey+"="+info.APIKey, envCallbackURL+"="+info.WebhookURL)
	out, err := submit.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("genbox submit --wait: exit %d\n%s\n%s", ee.ExitCode(), out, ee.Stderr)
		}
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(out), "\n") // "task  <id>", as a person reads it
	f := strings.Fields(first)
	if len(f) != 2 || f[0] != "task" || !strings.Contains(string(out), "delivered") {
		t.Fatalf("submit --wait printed %s", out)
	}
	want := "verified webhook-id=" + f[1] + ".task.succeeded.0"
	for !strings.Contains(devOut.String(), want) {
		if ctx.Err() != nil {
			t.Fatalf("the listener did not print %q:\n%s", want, devOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := dev.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("genbox dev after SIGTERM: %v\n%s", err, devErr.String())
		}
	case <-ctx.Done():
		t.Fatalf("genbox dev did not stop after SIGTERM\n%s", devErr.String())
	}
	for _, pid := range jvms {
		for alive(pid) {
			if ctx.Err() != nil {
				t.Fatalf("emulator process %d still running after genbox dev stopped", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, host := range []string{info.FirestoreHost, info.PubSubHost} {
		if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
			c.Close()
			t.Errorf("something still listens on %s", host)
		}
	}
}

// emulatorPIDs returns the processes whose command line serves one of hosts' ports: the emulator
// JVMs (and the Pub/Sub wrapper script).
func emulatorPIDs(t *testing.T, hosts ...string) []int {
	t.Helper()
	var ports []string
	for _, h := range hosts {
		_, port, err := net.SplitHostPort(h)
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, "--port="+port)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc: cannot look for emulator processes")
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range strings.Split(string(cmdline), "\x00") {
			for _, p := range ports {
				if arg == p {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may itself hold spaces.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// genbox dev on a machine whose Google Cloud CLI lacks the emulators says what is missing and the
// one command that installs it there — here a CLI with its own component manager — instead of a
// jar path, and exits 1 without starting anything.
func TestDevWithoutEmulatorsSaysHowToInstall(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	config := filepath.Join(root, "lib", "googlecloudsdk", "core", "config.json")
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte(`{"disable_updater": false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r := cli(t, map[string]string{"CLOUDSDK_ROOT": root}, "", "dev", "--addr", "127.0.0.1:0", "--dlq-addr", "127.0.0.1:0",
		"--slack-addr", "127.0.0.1:0", "--webhook-addr", "127.0.0.1:0", "--gemini-addr", "127.0.0.1:0")
	if r.code != exitFailure {
		t.Errorf("exit %d, want %d", r.code, exitFailure)
	}
	for _, want := range []string{"the Firestore emulator", "the Pub/Sub emulator", root, "\n  gcloud components install cloud-firestore-emulator pubsub-emulator"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, ".jar") || strings.Contains(r.stdout, readyLine) {
		t.Errorf("a jar path, or a stack that started:\n%s\n%s", r.stdout, r.stderr)
	}
}

// genbox dev whose port is taken says so and exits 1, without the client verbs' hint to start a
// server: it is the server.
func TestDevBindErrorHasNoServerHint(t *testing.T) {
	t.Parallel()
	project := emulator.ProjectID(t) // the shared emulators, reused
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	env := map[string]string{emulator.FirestoreHostEnv: os.Getenv(emulator.FirestoreHostEnv),
		emulator.PubSubHostEnv: os.Getenv(emulator.PubSubHostEnv), "GOOGLE_CLOUD_PROJECT": project}
	r := cli(t, env, "", "dev", "--addr", "127.0.0.1:0", "--dlq-addr", "127.0.0.1:0", "--slack-addr", "127.0.0.1:0",
		"--webhook-addr", "127.0.0.1:0", "--gemini-addr", taken.Addr().String())
	if r.code != exitFailure {
		t.Errorf("exit %d, want %d\n%s", r.code, exitFailure, r.stderr)
	}
	if !strings.Contains(r.stderr, "address already in use") {
		t.Errorf("stderr does not name the bind error:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "is the server running?") {
		t.Errorf("stderr carries the client verbs' hint:\n%s", r.stderr)
	}
}
