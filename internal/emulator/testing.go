package emulator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// RunHint says how to run the tests that need the emulators.
const RunHint = "run scripts/test.sh (Java 17 and the emulators: docs/development.md)"

// binary is this test binary's emulator pair: the one named by the environment (as
// scripts/test.sh exports it, shared by every package of a run) or a pair started by the first
// test that needs it, stopped when RunTests returns.
var binary struct {
	once    sync.Once
	e       *Emulators
	err     error
	skipped atomic.Int64
}

// RunTests runs a test binary's tests from TestMain: os.Exit(emulator.RunTests(m)). No emulator
// starts until a test asks for one (Require, ProjectID), so a run of tests that need none starts
// none. examples names the package's Example functions that need the emulators: an Example cannot
// skip itself, so when the run selects one the emulators start before it, and where they cannot
// (Unavailable) it is left out with a message.
func RunTests(m *testing.M, examples ...string) int {
	flag.Parse()
	if len(examples) > 0 {
		if err := prepareExamples(examples); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := m.Run()
	if n := binary.skipped.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "emulator: %d tests skipped, needing the Firestore and Pub/Sub emulators: %s\n", n, RunHint)
	}
	if binary.e != nil {
		binary.e.Stop()
	}
	return code
}

// prepareExamples starts the emulators when the run selects one of examples, or leaves those out
// with -test.skip when the emulators are unavailable.
func prepareExamples(examples []string) error {
	var selected []string
	for _, name := range examples {
		if runs(name) {
			selected = append(selected, name)
		}
	}
	if len(selected) == 0 {
		return nil
	}
	if why := Unavailable(); why != "" {
		fmt.Fprintf(os.Stderr, "emulator: %s not run (%s): %s\n", strings.Join(selected, ", "), why, RunHint)
		skip := "^(" + strings.Join(selected, "|") + ")$"
		if prev := flagValue("test.skip"); prev != "" {
			skip = prev + "|" + skip
		}
		return flag.Set("test.skip", skip)
	}
	_, err := start()
	return err
}

// runs reports whether the run's -test.run and -test.skip select the top-level test name.
func runs(name string) bool {
	match := func(expr string) bool {
		first, _, _ := strings.Cut(expr, "/")
		ok, err := regexp.MatchString(first, name)
		return err == nil && ok
	}
	if run := flagValue("test.run"); run != "" && !match(run) {
		return false
	}
	skip := flagValue("test.skip")
	return skip == "" || !match(skip)
}

func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// Unavailable says why this run cannot use the emulators, or "" when it can: -short leaves them
// out, and without emulators named by the environment they need a Java runtime on PATH.
func Unavailable() string {
	if os.Getenv(FirestoreHostEnv) != "" && os.Getenv(PubSubHostEnv) != "" && !testing.Short() {
		return ""
	}
	return noJava()
}

// noJava says why this run cannot start emulators of its own, or "" when it can.
func noJava() string {
	if testing.Short() {
		return "-short"
	}
	if _, err := exec.LookPath("java"); err != nil {
		return "no java on PATH"
	}
	return ""
}

// Require skips t when the emulators are unavailable (-short, no Java), saying how to run it;
// otherwise it starts this binary's pair on first use, points the Google Cloud client libraries at
// it, and returns it. A pair that cannot start fails t.
func Require(t testing.TB) *Emulators {
	t.Helper()
	if why := Unavailable(); why != "" {
		skip(t, why)
	}
	e, err := start()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// SkipWithoutJava skips t, saying how to run it, under -short or when no Java runtime is on PATH:
// for a test that starts emulators of its own rather than this binary's pair.
func SkipWithoutJava(t testing.TB) {
	t.Helper()
	if why := noJava(); why != "" {
		skip(t, why)
	}
}

func skip(t testing.TB, why string) {
	t.Helper()
	binary.skipped.Add(1)
	t.Skipf("needs the Firestore and Pub/Sub emulators (%s): %s", why, RunHint)
}

// start starts (or reuses) this binary's emulator pair once and points the process at it.
func start() (*Emulators, error) {
	binary.once.Do(func() {
		e, err := Start(context.Background(), Options{})
		if err == nil {
			err = e.Setenv()
		}
		binary.e, binary.err = e, err
	})
	return binary.e, binary.err
}

// ProjectID returns a project id of the test's own, so tests sharing one emulator pair never see
// each other's documents, topics or subscriptions. A test that names a project uses the
// emulators: ProjectID calls Require first.
func ProjectID(t testing.TB) string {
	t.Helper()
	Require(t)
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := strings.ToLower(t.Name())
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	if len(name) > 16 {
		name = name[:16]
	}
	return "t-" + strings.Trim(name, "-") + "-" + hex.EncodeToString(b[:])
}
