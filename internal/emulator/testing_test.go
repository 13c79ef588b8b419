package emulator

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// childEnv marks a run of this test binary by TestRequireSkips.
const childEnv = "GENBOX_EMULATOR_REQUIRE_CHILD"

// TestRequireChild is the test TestRequireSkips runs in a child process; elsewhere it does nothing.
func TestRequireChild(t *testing.T) {
	t.Parallel()
	if os.Getenv(childEnv) == "" {
		return
	}
	Require(t)
	t.Fatal("Require returned: the emulators were taken as available")
}

// Where the emulators cannot run — no java on PATH and none named by the environment, or -short
// even with them named — a test that requires them skips with a message saying how to run it,
// instead of failing or starting anything.
func TestRequireSkips(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		env  []string
		args []string
	}{
		"no java": {env: []string{"PATH=" + t.TempDir()}},
		"-short":  {env: []string{"PATH=" + os.Getenv("PATH"), FirestoreHostEnv + "=127.0.0.1:1", PubSubHostEnv + "=127.0.0.1:1"}, args: []string{"-test.short"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestRequireChild$", "-test.v"}, c.args...)...)
			cmd.Env = append(c.env, childEnv+"=1", "HOME="+os.Getenv("HOME"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child failed: %v\n%s", err, out)
			}
			for _, want := range []string{"--- SKIP: TestRequireChild", "needs the Firestore and Pub/Sub emulators", "scripts/test.sh"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("child output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
