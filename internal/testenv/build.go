package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Build is a set of Go binaries built once for every test of a package that runs them as
// processes, into a directory that outlives each test (t.TempDir would vanish with the first):
// the package's TestMain calls Remove after the run.
type Build struct {
	name  string
	build func(dir string) error
	once  sync.Once
	dir   string
	err   error
}

// NewBuild returns a Build whose build writes the binaries into dir; name prefixes the directory.
func NewBuild(name string, build func(dir string) error) *Build {
	return &Build{name: name, build: build}
}

// Dir builds the binaries on the first call and returns their directory, failing t if they do
// not build.
func (b *Build) Dir(t testing.TB) string {
	t.Helper()
	b.once.Do(b.make)
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

// make builds into a directory of the run's, not of one test's.
func (b *Build) make() {
	if b.dir, b.err = os.MkdirTemp("", b.name); b.err == nil {
		b.err = b.build(b.dir)
	}
}

// Remove deletes the binaries, if they were built.
func (b *Build) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// GoBuild runs `go build args...` in dir ("" for the test's own package).
func GoBuild(dir string, args ...string) error {
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
