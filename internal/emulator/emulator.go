// Package emulator starts and stops the official Firestore and Pub/Sub emulators for tests and
// for `genbox dev`. It reuses emulators already named by FIRESTORE_EMULATOR_HOST and
// PUBSUB_EMULATOR_HOST, and otherwise runs each JVM in its own process group on a free loopback
// port, so stopping it leaves no Java process behind.
package emulator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Environment variables the Google Cloud client libraries read to find the emulators.
const (
	FirestoreHostEnv = "FIRESTORE_EMULATOR_HOST"
	PubSubHostEnv    = "PUBSUB_EMULATOR_HOST"
)

// ErrMissing means an emulator cannot be started because something is not installed; the error
// is a *MissingError, whose message says what and the command that installs it on this machine.
var ErrMissing = errors.New("emulator: not installed")

// Options say where to find the emulators.
type Options struct {
	// SDKRoot is the Google Cloud SDK root. Empty: CLOUDSDK_ROOT, then `gcloud info`, then
	// /usr/lib/google-cloud-sdk.
	SDKRoot string
	// Java is the java binary. Empty: java on PATH.
	Java string
	// Getenv reads the environment (os.Getenv when nil).
	Getenv func(string) string
	// Log receives the emulators' output (discarded when nil).
	Log io.Writer
	// StartTimeout bounds the wait for an emulator to be ready (60 s when zero).
	StartTimeout time.Duration
	// PubSubPort is the port of a Pub/Sub emulator Start launches (0: a free one), so that a
	// test can restart it empty on the same address.
	PubSubPort int
	// System is where /etc is read from to tell how this machine installs what is missing
	// (os-release, apt's sources); empty: "/". Tests point it at a fake.
	System string
}

// Emulators is a running (or reused) pair of emulators.
type Emulators struct {
	FirestoreHost string
	PubSubHost    string

	mu    sync.Mutex
	procs []*proc
}

type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd.Wait returns
}

// Start returns the emulators named by the environment, starting those that are not.
func Start(ctx context.Context, o Options) (*Emulators, error) {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	e := &Emulators{FirestoreHost: o.Getenv(FirestoreHostEnv), PubSubHost: o.Getenv(PubSubHostEnv)}
	if e.FirestoreHost != "" && e.PubSubHost != "" {
		return e, nil
	}
	root := sdkRoot(o)
	java := o.Java
	if java == "" {
		java = "java"
	}
	jar := filepath.Join(root, "platform", "cloud-firestore-emulator", "cloud-firestore-emulator.jar")
	bin := filepath.Join(root, "platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
	javaPath, err := exec.LookPath(java)
	missing := &MissingError{Java: err != nil, SDKRoot: root}
	if _, err := os.Stat(jar); err != nil && e.FirestoreHost == "" {
		missing.Firestore = true
	}
	if _, err := os.Stat(bin); err != nil && e.PubSubHost == "" {
		missing.PubSub = true
	}
	if missing.Java || missing.Firestore || missing.PubSub {
		sys := o.System
		if sys == "" {
			sys = "/"
		}
		missing.Install = missing.installSteps(sys)
		return nil, missing
	}
	if e.FirestoreHost == "" {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		host := "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command(javaPath, "-cp", jar, "com.google.cloud.datastore.emulator.firestore.CloudFirestore",
			"start", "--host=127.0.0.1", "--port="+strconv.Itoa(port))
		if err := e.run(ctx, cmd, "Dev App Server is now running", o); err != nil {
			e.Stop()
			return nil, fmt.Errorf("start Firestore emulator: %w", err)
		}
		e.FirestoreHost = host
	}
	if e.PubSubHost == "" {
		port, err := freePort()
		if err != nil {
			e.Stop()
			return nil, err
		}
		if o.PubSubPort != 0 {
			port = o.PubSubPort
		}
		cmd := exec.Command(bin, "--host=127.0.0.1", "--port="+strconv.Itoa(port))
		cmd.Env = append(os.Environ(), "JAVA="+javaPath, "PATH="+filepath.Dir(javaPath)+string(os.PathListSeparator)+os.Getenv("PATH"))
		if err := e.run(ctx, cmd, "Server started", o); err != nil {
			e.Stop()
			return nil, fmt.Errorf("start Pub/Sub emulator: %w", err)
		}
		e.PubSubHost = "127.0.0.1:" + strconv.Itoa(port)
	}
	return e, nil
}

// Setenv points the Google Cloud client libraries of this process at the emulators.
func (e *Emulators) Setenv() error {
	return errors.Join(os.Setenv(FirestoreHostEnv, e.FirestoreHost), os.Setenv(PubSubHostEnv, e.PubSubHost))
}

// Started reports whether Start launched any emulator (rather than reusing running ones).
func (e *Emulators) Started() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.procs) > 0
}

// Stop kills the process group of every emulator Start launched and waits for it to end.
func (e *Emulators) Stop() {
	e.mu.Lock()
	procs := e.procs
	e.procs = nil
	e.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
}

// launched holds every emulator process this process started and has not stopped, for StopAll.
var launched = struct {
	sync.Mutex
	procs map[*proc]bool
}{procs: map[*proc]bool{}}

// StopAll kills every emulator this process started and has not stopped, whoever started it: for
// a process about to exit at once (a second Ctrl-C), whose emulators, each in its own process
// group, would otherwise outlive it.
func StopAll() {
	launched.Lock()
	procs := make([]*proc, 0, len(launched.procs))
	for p := range launched.procs {
		procs = append(procs, p)
	}
	launched.Unlock()
	for _, p := range procs {
		p.kill()
	}
}

// kill ends p's process group and waits for p to exit.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
	launched.Lock()
	delete(launched.procs, p)
	launched.Unlock()
}

// run starts cmd in its own process group and waits until its output contains ready.
func (e *Emulators) run(ctx context.Context, cmd *exec.Cmd, ready string, o Options) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	launched.Lock()
	launched.procs[p] = true
	launched.Unlock()
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			fmt.Fprintln(o.Log, sc.Text())
			if strings.Contains(sc.Text(), ready) {
				once.Do(func() { close(found) })
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		pw.Close()
		close(p.exited)
	}()
	timer := time.NewTimer(o.StartTimeout)
	defer timer.Stop()
	select {
	case <-found:
		return nil
	case <-p.exited:
		if waitErr == nil {
			return fmt.Errorf("%s exited before it was ready", cmd.Path)
		}
		return fmt.Errorf("%s exited before it was ready: %w", cmd.Path, waitErr)
	case <-timer.C:
		return fmt.Errorf("%s not ready after %s", cmd.Path, o.StartTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sdkRoot(o Options) string {
	if o.SDKRoot != "" {
		return o.SDKRoot
	}
	if r := o.Getenv("CLOUDSDK_ROOT"); r != "" {
		return r
	}
	if out, err := exec.Command("gcloud", "info", "--format=value(installation.sdk_root)").Output(); err == nil {
		if r := strings.TrimSpace(string(out)); r != "" {
			return r
		}
	}
	return "/usr/lib/google-cloud-sdk"
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
