package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) {
	code := emulator.RunTests(m)
	crashBuild.Remove()
	os.Exit(code)
}

// stack is one test's project: Firestore, Pub/Sub with the topology bootstrapped, a fake Gemini.
type stack struct {
	project string
	store   *store.Store
	ps      *pubsub.Client
	pub     *bus.Publisher
	fake    *geminitest.Server
}

func newStack(t testing.TB, latency time.Duration) *stack {
	t.Helper()
	top := bus.DefaultTopology()
	top.AckDeadline = 10 * time.Second
	p := testenv.NewProject(t, top)
	pub := bus.NewPublisher(p.PubSub)
	t.Cleanup(func() { pub.Close() })
	fake := geminitest.NewServer(geminitest.WithLatency("", geminitest.Fixed(latency)))
	t.Cleanup(fake.Close)
	return &stack{project: p.ID, store: p.Store, ps: p.PubSub, pub: pub, fake: fake}
}

// env is the worker's environment for this stack: short leases and sweeps.
func (s *stack) env(extra ...string) map[string]string {
	e := map[string]string{
		"GOOGLE_CLOUD_PROJECT":      s.project,
		"FIRESTORE_EMULATOR_HOST":   os.Getenv("FIRESTORE_EMULATOR_HOST"),
		"PUBSUB_EMULATOR_HOST":      os.Getenv("PUBSUB_EMULATOR_HOST"),
		"GOOGLE_GEMINI_BASE_URL":    s.fake.URL,
		"GENBOX_MODEL_CHAIN":        "m",
		"GENBOX_BACKOFF_BASE":       "10ms",
		"GENBOX_BACKOFF_MAX":        "50ms",
		"PORT":                      "0",
		"GENBOX_LEASE_TTL":          "1500ms",
		"GENBOX_LEASE_RENEW":        "300ms",
		"GENBOX_SWEEP_INTERVAL":     "200ms",
		"GENBOX_SWEEP_LEADER_TTL":   "1s",
		"GENBOX_SWEEP_BACKOFF_BASE": "1s",
		"GENBOX_SWEEP_BACKOFF_MAX":  "2s",
		"GENBOX_NUDGE_GRACE":        "2s",
		"GENBOX_RETRY_BASE":         "100ms",
		"GENBOX_SHUTDOWN_GRACE":     "2s",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		e[extra[i]] = extra[i+1]
	}
	return e
}

// submit writes a queued task whose input names its id, then nudges it unless nudge is false.
// Like the publisher, it sets nudge_at so the sweeper leaves the fresh task to its own nudge.
func (s *stack) submit(t testing.TB, id string, nudge bool) {
	t.Helper()
	ctx := context.Background()
	grace := time.Now().Add(time.Second)
	doc := &protocol.Task{
		ID: id, Tenant: "tenant-a", Family: "summarize", Variant: "default", Input: "The report " + id + " says little.",
		State: task.StateQueued, CallbackURL: "https://app.example/hook", NudgeAt: &grace,
	}
	if err := s.store.CreateTask(ctx, doc); err != nil {
		t.Fatal(err)
	}
	if nudge {
		if _, err := s.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: id}); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *stack) get(t testing.TB, id string) *protocol.Task {
	t.Helper()
	doc, err := s.store.GetTask(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// crashRecovery bounds how long tasks may take to recover from a SIGKILLed worker: by
// docs/liveness.md, the killed worker's task lease or the sweeper leadership it held (1.5 s and
// 1 s + 0.2 s here) and a pass, then the calls — a few seconds — with ample room for starting a
// process on a loaded machine. Task writes take no lock a killed process could leave behind. It
// is a liveness bound: a run that recovers sooner passes sooner.
const crashRecovery = time.Minute

// waitState polls until every task is in state.
func (s *stack) waitState(t *testing.T, d time.Duration, state task.State, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, id := range ids {
		for s.get(t, id).State != state {
			if time.Now().After(deadline) {
				t.Fatalf("task %s is %s, want %s", id, s.get(t, id).State, state)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// runWithCallHeld submits the task id, runs the service with the shutdown grace given and returns
// once the task's model call has started: the call is held until gate is released, at the latest
// when t ends (before the service is stopped).
func (s *stack) runWithCallHeld(t *testing.T, id, grace string) (svc *testenv.Service, gate *geminitest.Gate) {
	t.Helper()
	gate = s.fake.Block("m")
	s.submit(t, id, true)
	svc = testenv.Start(t, run, s.env("GENBOX_SHUTDOWN_GRACE", grace))
	t.Cleanup(gate.Release) // cleanups run last first: the held call goes on before the stop
	select {
	case <-gate.Entered():
	case <-time.After(60 * time.Second):
		t.Fatalf("the call never started\n%s", svc.Log.String())
	}
	return svc, gate
}

// addrRE finds the port in a worker subprocess's "worker started" line.
var addrRE = regexp.MustCompile(`"addr":"[^"]*:(\d+)"`)

// The service serves /healthz, carries a nudged task, a task written but never nudged (the
// publisher crashed) and a task whose messages were all lost (Pub/Sub restarted empty) to
// success, and stops cleanly.
func TestRunCarriesEveryTask(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	ctx := context.Background()
	s.submit(t, "pushed", true)
	s.submit(t, "silent", false)
	s.submit(t, "lost", true)
	// Every message is lost: the subscription is recreated empty, as after an emulator restart.
	name := "projects/" + s.project + "/subscriptions/" + bus.SubWorker
	if err := s.ps.SubscriptionAdminClient.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: name}); err != nil {
		t.Fatal(err)
	}
	top := bus.DefaultTopology()
	top.AckDeadline = 10 * time.Second
	if err := bus.Bootstrap(ctx, s.ps, top); err != nil {
		t.Fatal(err)
	}
	svc := testenv.Start(t, run, s.env())
	s.waitState(t, 60*time.Second, task.StateSucceeded, "pushed", "silent", "lost")
	for _, id := range []string{"pushed", "silent", "lost"} {
		if n := len(s.fake.Ledger().BillsFor(id)); n != 1 {
			t.Errorf("%s billed %d times", id, n)
		}
	}
	resp, err := http.Get(svc.Started(t, "worker", 10*time.Second) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %d", resp.StatusCode)
	}
	svc.StopClean(t)
}

// On SIGTERM a call that cannot finish within the grace period releases its lease: nothing is
// lost, no attempt is counted.
func TestShutdownReleasesWhatCannotFinish(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	svc, _ := s.runWithCallHeld(t, "slow", "300ms")
	svc.StopClean(t)
	got := s.get(t, "slow")
	if got.State != task.StateQueued || got.Lease.Owner != "" || got.Attempts != 0 || got.DueAt == nil {
		t.Errorf("after shutdown: state %s lease %+v attempts %d due_at %v", got.State, got.Lease, got.Attempts, got.DueAt)
	}
}

// crashBuild is this service with its crash points compiled in (genbox_crashpoints).
var crashBuild = testenv.NewBuild("genbox-worker-crash", func(dir string) error {
	return testenv.GoBuild("", "-tags", "genbox_crashpoints", "-o", filepath.Join(dir, "worker"), ".")
})

// crashBinary builds the crash binary once for the run.
func crashBinary(t *testing.T) string {
	t.Helper()
	emulator.Require(t) // it runs only against the emulators: no build where they are unavailable
	return filepath.Join(crashBuild.Dir(t), "worker")
}

// proc is a worker subprocess.
type proc struct {
	cmd  *exec.Cmd
	out  *testenv.LogBuffer
	done chan error
}

func spawn(t *testing.T, env map[string]string) *proc {
	t.Helper()
	cmd := exec.Command(crashBinary(t))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{cmd: cmd, out: &testenv.LogBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		exit := <-p.done
		if t.Failed() {
			t.Logf("worker pid %d (%v) output:\n%s", cmd.Process.Pid, exit, p.out.String())
		}
	})
	return p
}

// waitKilled waits for the armed process to kill itself at its crash point.
func (p *proc) waitKilled(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("worker ended with %v, want killed at its crash point\n%s", err, p.out.String())
		}
	case <-time.After(d):
		t.Fatalf("worker never reached its crash point\n%s", p.out.String())
	}
}

// Crash matrix with real processes: a worker built with crash points is SIGKILLed at each step of
// the protocol; a fresh worker then carries every task to success. Each task is billed once,
// except where the crash fell between the start of the model call and its commit: at most twice.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	crashBinary(t)
	for _, point := range crashpoint.Points {
		t.Run(string(point), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, 600*time.Millisecond)
			ids := []string{string(point) + "-1", string(point) + "-2", string(point) + "-3"}
			for _, id := range ids {
				s.submit(t, id, true)
			}
			// One task in hand at a time — one model-call slot, one message — so the crash cuts
			// exactly one task's protocol short: with more, it would fall inside the paid window
			// of another task's call, which the pipeline overlaps with this one's commit.
			crashed := spawn(t, s.env("GENBOX_CRASHPOINT", string(point), "GENBOX_CONCURRENCY", "1", "GENBOX_MAX_IN_FLIGHT", "1",
				"GENBOX_INSTANCE_ID", "crashing"))
			crashed.waitKilled(t, crashRecovery)
			spawn(t, s.env("GENBOX_INSTANCE_ID", "fresh"))
			s.waitState(t, crashRecovery, task.StateSucceeded, ids...)
			maxBills := 1
			if point == crashpoint.MidGenerate || point == crashpoint.Answered {
				maxBills = 2
			}
			for _, id := range ids {
				got := s.get(t, id)
				bills := len(s.fake.Ledger().BillsFor(id))
				t.Logf("%s: billed %d time(s), output epoch %d, claims %d", id, bills, got.OutputEpoch, got.Claims)
				if bills < 1 || bills > maxBills || !got.HasOutput() {
					t.Errorf("%s billed %d times (max %d), output stored %v", id, bills, maxBills, got.HasOutput())
				}
			}
		})
	}
}

// A task that kills its worker every time ends dead after the claim cap, with one DLQ notice.
func TestCrashEveryTimeEndsDead(t *testing.T) {
	t.Parallel()
	crashBinary(t)
	s := newStack(t, 0)
	s.submit(t, "poison", true)
	const claimCap = 2
	for i := 0; i <= claimCap; i++ {
		p := spawn(t, s.env("GENBOX_CRASHPOINT", string(crashpoint.AfterClaim), "GENBOX_CLAIM_CAP", fmt.Sprint(claimCap), "GENBOX_INSTANCE_ID", fmt.Sprint("w", i)))
		p.waitKilled(t, crashRecovery)
	}
	spawn(t, s.env("GENBOX_CLAIM_CAP", fmt.Sprint(claimCap), "GENBOX_INSTANCE_ID", "last"))
	s.waitState(t, crashRecovery, task.StateDead, "poison")
	got := s.get(t, "poison")
	if len(got.Notices) != 1 || got.Notices[0].Stage != task.StageGeneration || got.Error == nil || got.Error.Kind != task.KindCrash {
		t.Errorf("dead task: notices %+v error %+v", got.Notices, got.Error)
	}
	if got.Delivery.EventType != task.EventDead {
		t.Errorf("event %s, want task.dead", got.Delivery.EventType)
	}
	if n := s.fake.Ledger().Total.Calls; n != 0 {
		t.Errorf("%d model calls for a task that never got past its claim", n)
	}
	// The notice reached gemini-tasks-dlq.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var notices []*pubsub.Message
	_ = s.ps.Subscriber(bus.SubTasksDLQ).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		notices = append(notices, m)
		mu.Unlock()
		cancel()
	})
	if len(notices) == 0 || notices[0].Attributes[task.AttrTaskID] != "poison" || notices[0].Attributes[task.AttrKind] != "notice" {
		t.Errorf("DLQ notice messages %+v", notices)
	}
}

// On SIGTERM a call that finishes within the grace period persists its output.
func TestShutdownLetsCallsFinishWithinGrace(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	svc, gate := s.runWithCallHeld(t, "finishing", "20s")
	stopped := make(chan error, 1)
	go func() { stopped <- svc.Stop() }() // SIGTERM while the call runs
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(svc.Log.String(), "shutting down"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("run never began shutting down")
		}
	}
	gate.Release()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if got := s.get(t, "finishing"); got.State != task.StateSucceeded || !got.HasOutput() {
		t.Errorf("after shutdown: state %s output %v", got.State, got.HasOutput())
	}
}

// A GENBOX_PROMPTS_DIR that does not load stops the worker at start, naming the variable: a
// worker rendering other families than the publisher validated would fail tasks it accepted.
func TestRunRefusesBadPromptsDir(t *testing.T) {
	t.Parallel()
	env := map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:1",
		"GENBOX_PROMPTS_DIR": filepath.Join(t.TempDir(), "missing")}
	err := run(testenv.Ended(), func(k string) string { return env[k] }, &testenv.LogBuffer{})
	if err == nil || !strings.Contains(err.Error(), "GENBOX_PROMPTS_DIR") {
		t.Fatalf("run answered %v, want an error naming GENBOX_PROMPTS_DIR", err)
	}
}
