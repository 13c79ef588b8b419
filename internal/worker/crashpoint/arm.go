//go:build genbox_crashpoints

package crashpoint

import (
	"fmt"
	"os"
	"syscall"
)

// EnvPoint names the crash point a genbox_crashpoints build dies at the first time it is hit.
const EnvPoint = "GENBOX_CRASHPOINT"

func init() {
	target := Point(os.Getenv(EnvPoint))
	if target == "" {
		return
	}
	armed = func(p Point) {
		if p != target {
			return
		}
		fmt.Fprintf(os.Stderr, "crashpoint %s: SIGKILL\n", p)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
