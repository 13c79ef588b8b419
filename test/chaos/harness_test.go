package chaos_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

var soak = flag.Bool("soak", false, "run the long versions of the chaos scenarios")

// scale picks the short (CI) or the soak version of a duration or a count.
func scale[T any](short, long T) T {
	if *soak {
		return long
	}
	return short
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := emulator.RunTests(m)
	services.Remove()
	os.Exit(code)
}

// Services, as built into binaries.
const (
	svcPublisher     = "publisher"
	svcWorker        = "worker"
	svcResultHandler = "resulthandler"
	svcDLQNotifier   = "dlqnotifier"
)

// services are the four services as binaries: the worker with its crash points compiled in;
// without symbol tables (-s -w), which halves the link time that dominates the suite on 2 cores.
var services = testenv.NewBuild("genbox-chaos-bin", func(dir string) error {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return fmt.Errorf("module root: %w", err)
	}
	mod := strings.TrimSpace(string(root))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs error
	build := func(args ...string) {
		defer wg.Done()
		if err := testenv.GoBuild(mod, args...); err != nil {
			mu.Lock()
			errs = errors.Join(errs, err)
			mu.Unlock()
		}
	}
	wg.Add(2)
	go build("-ldflags=-s -w", "-tags", "genbox_crashpoints", "-o", filepath.Join(dir, svcWorker), "./services/worker")
	go build("-ldflags=-s -w", "-o", dir+string(filepath.Separator), "./services/publisher", "./services/resulthandler", "./services/dlqnotifier")
	wg.Wait()
	return errs
})

// binaries builds the four services once per run and returns their directory.
func binaries(t testing.TB) string {
	t.Helper()
	emulator.Require(t) // they run only against the emulators: no build where they are unavailable
	return services.Dir(t)
}

// proc is one service process. When supervised, it is started again whenever it exits on its
// own, as Cloud Run restarts a crashed instance.
type proc struct {
	name string
	bin  string
	env  map[string]string
	out  *testenv.LogBuffer

	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	supervised bool
	stopped    bool
	restarts   int
	// kills are the times the harness SIGKILLed the process: for the resulthandler, the only
	// moments that may leave a receiver's 2xx unrecorded, and so the only causes a duplicate
	// delivery may have.
	kills []time.Time
}

func (p *proc) start(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.startLocked(); err != nil {
		t.Fatal(err)
	}
}

func (p *proc) startLocked() error {
	cmd := exec.Command(p.bin)
	for k, v := range p.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	fmt.Fprintf(p.out, "--- %s started, pid %d\n", p.name, cmd.Process.Pid)
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(p.out, "--- %s pid %d exited: %v\n", p.name, cmd.Process.Pid, err)
		close(exited)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.supervised && !p.stopped && p.cmd == cmd {
			p.restarts++
			time.AfterFunc(300*time.Millisecond, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				if !p.stopped && p.cmd == cmd {
					_ = p.startLocked()
				}
			})
		}
	}()
	return nil
}

// waitExit waits for the current process to exit and reports whether SIGKILL ended it.
func (p *proc) waitExit(d time.Duration) (killed, ok bool) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	select {
	case <-exited:
		ws, isWS := cmd.ProcessState.Sys().(syscall.WaitStatus)
		return isWS && ws.Signaled() && ws.Signal() == syscall.SIGKILL, true
	case <-time.After(d):
		return false, false
	}
}

// kill SIGKILLs the current process (a supervised one is started again) and records when.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.killLocked(p.cmd)
	}
}

// killLocked SIGKILLs cmd and records when; p.mu is held.
func (p *proc) killLocked(cmd *exec.Cmd) {
	p.kills = append(p.kills, time.Now())
	_ = cmd.Process.Kill()
}

// killed returns the times the harness SIGKILLed the process, whichever way it did.
func (p *proc) killed() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.kills...)
}

// stop ends the process for good: SIGTERM, then SIGKILL after a grace.
func (p *proc) stop() {
	p.mu.Lock()
	p.stopped = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		p.mu.Lock()
		p.killLocked(cmd)
		p.mu.Unlock()
		<-exited
	}
}

// stack is one scenario's system: its own project on the emulators (or its own Pub/Sub
// emulator), the four services as processes, the fake Gemini and the app's receiver in the test.
type stack struct {
	t       testing.TB
	project string
	psHost  string
	store   *store.Store
	fake    *geminitest.Server
	recv    *doubles.Receiver
	slack   *doubles.Slack
	api     *client.Client
	pubURL  string
	env     map[string]string
	procs   map[string]*proc
	began   time.Time

	mu    sync.Mutex
	tasks []submitted
}

// submitted is a task as the app submitted it; its input carries a marker the ledger finds.
type submitted struct {
	id, marker string
}

// ownPubSub starts a Pub/Sub emulator of the test's own on port — one the test can stop and start
// again on the same address — beside the shared Firestore emulator; it is stopped when t ends.
func ownPubSub(t *testing.T, port int) *emulator.Emulators {
	t.Helper()
	emu, err := emulator.Start(context.Background(), emulator.Options{PubSubPort: port, Getenv: func(k string) string {
		if k == emulator.FirestoreHostEnv {
			return os.Getenv(k)
		}
		return ""
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Stop)
	return emu
}

// freePort returns a loopback port nobody listens on now.
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// webhookTimeout bounds one webhook POST (GENBOX_WEBHOOK_TIMEOUT).
const webhookTimeout = 2 * time.Second

// topology is production's with short redelivery backoff.
func topology() bus.Topology {
	top := bus.DefaultTopology()
	top.AckDeadline = 10 * time.Second
	top.MinBackoff, top.MaxBackoff = 100*time.Millisecond, 2*time.Second
	return top
}

// newStack prepares a scenario: project, topology, tenant and API key, fake Gemini with latency,
// receiver, and the services' environment. psHost is the Pub/Sub emulator ("" for the shared one).
func newStack(t testing.TB, latency geminitest.Latency, psHost string) *stack {
	t.Helper()
	return newStackOn(t, latency, psHost, topology())
}

// newStackOn is newStack with the Pub/Sub topology top.
func newStackOn(t testing.TB, latency geminitest.Latency, psHost string, top bus.Topology) *stack {
	t.Helper()
	bin := binaries(t)
	ctx := context.Background()
	if psHost == "" {
		psHost = os.Getenv(emulator.PubSubHostEnv)
	}
	s := &stack{t: t, project: emulator.ProjectID(t), psHost: psHost, procs: map[string]*proc{}, slack: &doubles.Slack{}, began: time.Now()}
	s.store = store.New(testenv.Firestore(t, s.project))
	s.store.Secrets = testenv.Secrets()
	testenv.BusAt(t, s.project, psHost, top)

	s.fake = geminitest.NewServer(geminitest.WithLatency("", latency))
	t.Cleanup(s.fake.Close)
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	s.recv = doubles.NewReceiver(t, secret)
	slackSrv := &http.Server{Handler: s.slack, ReadHeaderTimeout: 5 * time.Second}
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = slackSrv.Serve(sln) }()
	t.Cleanup(func() { _ = slackSrv.Close() })

	if _, err := s.store.CreateTenant(ctx, "chaos", store.DefaultLimits(), secret); err != nil {
		t.Fatal(err)
	}
	apiKey := "gbx_chaos_" + strings.ReplaceAll(s.project, "-", "")
	if _, err := s.store.CreateAPIKey(ctx, "chaos", apiKey); err != nil {
		t.Fatal(err)
	}
	s.env = map[string]string{
		"GOOGLE_CLOUD_PROJECT":    s.project,
		"FIRESTORE_EMULATOR_HOST": os.Getenv(emulator.FirestoreHostEnv),
		"PUBSUB_EMULATOR_HOST":    psHost,
		"GENBOX_ADMIN_KEY":        "chaos-admin-key-0123456789",
		// worker
		"GOOGLE_GEMINI_BASE_URL":    s.fake.URL,
		"GENBOX_BACKOFF_BASE":       "10ms",
		"GENBOX_BACKOFF_MAX":        "50ms",
		"GENBOX_LEASE_TTL":          "5s", // above the emulator's ~3 s lock timeout: a renewal stuck behind a contended lock must not lose the lease
		"GENBOX_LEASE_RENEW":        "500ms",
		"GENBOX_SWEEP_INTERVAL":     "200ms",
		"GENBOX_SWEEP_LEADER_TTL":   "1s",
		"GENBOX_SWEEP_BACKOFF_BASE": "500ms",
		"GENBOX_SWEEP_BACKOFF_MAX":  "2s",
		"GENBOX_NUDGE_GRACE":        "1s",
		"GENBOX_RETRY_BASE":         "100ms",
		"GENBOX_RETRY_MAX":          "1s",
		"GENBOX_PARK_BASE":          "300ms",
		"GENBOX_PARK_MAX":           "1s",
		"GENBOX_BREAKER_COOLDOWN":   "500ms",
		"GENBOX_SHUTDOWN_GRACE":     "1s",
		// resulthandler
		"GENBOX_CONSUMER":                 "pull",
		"GENBOX_ALLOW_INSECURE_CALLBACKS": "true",
		"GENBOX_WEBHOOK_TIMEOUT":          webhookTimeout.String(),
		"GENBOX_DELIVERY_BACKOFF_MIN":     "200ms",
		"GENBOX_DELIVERY_BACKOFF_MAX":     "1s",
		"GENBOX_NOTICE_GRACE":             "1s",
		"GENBOX_WEBHOOK_SECRETS_KEY":      testenv.SecretsKey,
		// publisher
		"GENBOX_PUBLISH_TIMEOUT": "2s",
		// dlqnotifier
		"SLACK_BOT_TOKEN":        "xoxb-chaos",
		"SLACK_SIGNING_SECRET":   "chaos-signing-secret",
		"GENBOX_SLACK_CHANNEL":   "#chaos",
		"GENBOX_SLACK_APPROVERS": "UCHAOS",
		"GENBOX_SLACK_API_URL":   "http://" + sln.Addr().String(),
	}
	pubPort := freePort(t)
	for _, name := range []string{svcPublisher, svcWorker, svcResultHandler, svcDLQNotifier} {
		p := &proc{name: name, bin: filepath.Join(bin, name), env: s.procEnv("GENBOX_INSTANCE_ID", name), out: &testenv.LogBuffer{}, supervised: true}
		if name == svcPublisher {
			p.env["PORT"] = pubPort
		}
		s.procs[name] = p
	}
	s.pubURL = "http://127.0.0.1:" + pubPort
	s.api = client.New(s.pubURL, apiKey, client.WithRetries(8), client.WithBackoff(100*time.Millisecond, time.Second))
	t.Cleanup(func() {
		for _, p := range s.procs {
			p.stop()
		}
		if t.Failed() {
			dir, err := os.MkdirTemp("", "genbox-chaos-logs-") //nolint:usetesting // kept after the run, for a human to read
			for name, p := range s.procs {
				t.Logf("=== %s output (tail):\n%s", name, tail(p.out.String(), 3000))
				if err == nil {
					_ = os.WriteFile(filepath.Join(dir, name+".log"), []byte(p.out.String()), 0o644)
				}
			}
			t.Logf("full service logs in %s", dir)
		}
	})
	return s
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// logf logs a phase of the scenario with the time since the stack was made.
func (s *stack) logf(format string, args ...any) {
	s.t.Helper()
	s.t.Logf("[%6.1fs] %s", time.Since(s.began).Seconds(), fmt.Sprintf(format, args...))
}

// procEnv is the services' environment with a few variables changed.
func (s *stack) procEnv(kv ...string) map[string]string {
	e := make(map[string]string, len(s.env)+len(kv)/2)
	for k, v := range s.env {
		e[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		e[kv[i]] = kv[i+1]
	}
	e["PORT"] = "0"
	return e
}

// start starts the named services (all four when none is named).
func (s *stack) start(names ...string) {
	if len(names) == 0 {
		names = []string{svcPublisher, svcResultHandler, svcDLQNotifier, svcWorker}
	}
	for _, n := range names {
		s.procs[n].start(s.t)
	}
	if slices.Contains(names, svcPublisher) {
		s.waitHealthy(s.pubURL)
	}
}

// waitHealthy polls base/healthz until it answers 200.
func (s *stack) waitHealthy(base string) {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s/healthz never answered 200: %v", base, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// submit submits n tasks through the publisher's REST API, as an app does.
func (s *stack) submit(n int, label string) []submitted {
	s.t.Helper()
	return s.submitEach(n, label, func(marker string) task.Request {
		return task.Request{Family: "summarize", Input: "Report " + marker + ": revenue rose while costs held flat.", CallbackURL: s.recv.URL()}
	})
}

// submitEach submits n tasks through the publisher's REST API, the request of each built by req
// from the task's marker (which the invariants find in its output).
func (s *stack) submitEach(n int, label string, req func(marker string) task.Request) []submitted {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []submitted
	for i := range n {
		s.mu.Lock()
		marker := fmt.Sprintf("chaos-%s-%03d", label, len(s.tasks))
		s.mu.Unlock()
		resp, err := s.api.Submit(ctx, req(marker))
		if err != nil {
			s.t.Fatalf("submit %s (%d of %d): %v", marker, i+1, n, err)
		}
		sub := submitted{id: resp.TaskID, marker: marker}
		s.mu.Lock()
		s.tasks = append(s.tasks, sub)
		s.mu.Unlock()
		out = append(out, sub)
	}
	return out
}

// crashAt starts a worker armed at each of points in turn, rounds times — one task in hand at a
// time (one model-call slot, one message) so a crash cuts exactly one task short — and waits for
// each to die there by SIGKILL. It returns the kills inside the paid window (mid_generation,
// answered): the only ones that may cost a second generation.
func (s *stack) crashAt(rounds int, points []crashpoint.Point) (paidWindowKills int) {
	s.t.Helper()
	w := s.procs[svcWorker]
	for round := range rounds {
		for _, point := range points {
			w.configure(s.procEnv("GENBOX_CRASHPOINT", string(point), "GENBOX_CONCURRENCY", "1", "GENBOX_MAX_IN_FLIGHT", "1",
				"GENBOX_INSTANCE_ID", "crash-"+string(point)+"-"+strconv.Itoa(round)), false)
			w.start(s.t)
			killed, exited := w.waitExit(90 * time.Second)
			if !exited || !killed {
				s.t.Fatalf("round %d: the worker armed at %s did not die there (exited %v, SIGKILL %v)", round, point, exited, killed)
			}
			s.logf("worker killed at %s", point)
			if point == crashpoint.MidGenerate || point == crashpoint.Answered {
				paidWindowKills++
			}
		}
	}
	return paidWindowKills
}

// outcome is what the invariants found, for the report.
type outcome struct {
	Tasks, Generations, ModelCalls, Duplicates int
	Billed, Needed                             int64
}

// checkInvariants waits until every submitted task has ended and its webhook arrived, then
// checks: no task lost (succeeded, delivery delivered, webhook received), one webhook-id per
// task event with duplicates only in the documented window (a resulthandler killed between a
// delivery's 2xx and its next arrival), and at most extraBills billed generations beyond one per
// task (the crashes inside the paid window).
func (s *stack) checkInvariants(within time.Duration, extraBills int) outcome {
	s.t.Helper()
	ctx := context.Background()
	s.mu.Lock()
	tasks := append([]submitted(nil), s.tasks...)
	s.mu.Unlock()
	deadline := time.Now().Add(within)
	for _, sub := range tasks {
		event := task.EventID(sub.id, task.EventSucceeded, 0)
		for {
			doc, err := s.store.GetTask(ctx, sub.id)
			if err != nil {
				s.t.Fatalf("task %s (%s) lost: %v", sub.id, sub.marker, err)
			}
			if doc.State == task.StateSucceeded && doc.Delivery.State == task.DeliveryDelivered && len(s.recv.Deliveries(event)) > 0 {
				s.logf("%s (%s) delivered", sub.id, sub.marker)
				break
			}
			if time.Now().After(deadline) {
				s.t.Fatalf("task %s (%s) not carried to its end: state %s, delivery %s, webhook received %d times",
					sub.id, sub.marker, doc.State, doc.Delivery.State, len(s.recv.Deliveries(event)))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// What was still in flight (a zombie's generation) is billed once the fake is idle.
	idle, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.fake.WaitIdle(idle); err != nil {
		s.t.Errorf("fake Gemini never idle: %v", err)
	}
	kills := s.procs[svcResultHandler].killed() // killAll's too: a POST may be in flight in any of them
	led := s.fake.Ledger()
	o := outcome{Tasks: len(tasks), ModelCalls: led.Total.Calls}
	for _, sub := range tasks {
		bills := led.BillsFor(sub.marker)
		if len(bills) == 0 {
			s.t.Errorf("task %s (%s) succeeded without a billed generation", sub.id, sub.marker)
			continue
		}
		o.Generations += len(bills)
		o.Needed += bills[0].Usage.TotalTokens
		for _, b := range bills {
			o.Billed += b.Usage.TotalTokens
		}
		arrivals := s.recv.Deliveries(task.EventID(sub.id, task.EventSucceeded, 0))
		for i := 1; i < len(arrivals); i++ {
			o.Duplicates++
			// The death may precede the receiver's 2xx by as long as the dead process's claim on the
			// delivery lasted (its lease: three webhook timeouts), the POST being in flight.
			inWindow := func(k time.Time) bool {
				return k.After(arrivals[i-1].At.Add(-3*webhookTimeout)) && k.Before(arrivals[i].At)
			}
			if !slices.ContainsFunc(kills, inWindow) {
				s.t.Errorf("task %s: webhook delivered again at %s with no resulthandler death while the previous delivery (%s) was in flight or unrecorded: a duplicate outside the documented window",
					sub.id, arrivals[i].At.Format(time.StampMilli), arrivals[i-1].At.Format(time.StampMilli))
			}
		}
	}
	distinct, _, bad := s.recv.Tally()
	if bad > 0 {
		s.t.Errorf("%d deliveries failed signature verification", bad)
	}
	if distinct != len(tasks) {
		s.t.Errorf("%d distinct webhook-ids for %d task events", distinct, len(tasks))
	}
	if o.Generations > len(tasks)+extraBills {
		s.t.Errorf("%d billed generations for %d tasks: more than the %d the crash windows allow", o.Generations, len(tasks), extraBills)
	}
	s.t.Logf("invariants: %d tasks, all succeeded and delivered; webhook duplicates %d; generations %d (%.2f per task); model calls %d (%.2f per task); billed ÷ needed tokens %d/%d = %.3f; restarts %s",
		o.Tasks, o.Duplicates, o.Generations, float64(o.Generations)/float64(o.Tasks), o.ModelCalls, float64(o.ModelCalls)/float64(o.Tasks),
		o.Billed, o.Needed, float64(o.Billed)/float64(max(o.Needed, 1)), s.restarts())
	return o
}

func (s *stack) restarts() string {
	var parts []string
	for _, n := range []string{svcPublisher, svcWorker, svcResultHandler, svcDLQNotifier} {
		p := s.procs[n]
		p.mu.Lock()
		parts = append(parts, fmt.Sprintf("%s=%d", n, p.restarts))
		p.mu.Unlock()
	}
	return strings.Join(parts, " ")
}
