package emulator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
)

// RunTests runs a test binary's tests against one emulator pair: the one named by the environment
// (as .ci/run exports it, shared by every package of a run) or a pair started for this binary and
// stopped after it. Use it from TestMain: os.Exit(emulator.RunTests(m)).
func RunTests(m *testing.M) int {
	e, err := Start(context.Background(), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer e.Stop()
	if err := e.Setenv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// ProjectID returns a project id of the test's own, so tests sharing one emulator pair never see
// each other's documents, topics or subscriptions.
func ProjectID(t testing.TB) string {
	t.Helper()
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
