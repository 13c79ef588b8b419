package emulator

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func noEnv(string) string { return "" }

func TestMissingJavaNamesAJDK(t *testing.T) {
	t.Parallel()
	_, err := Start(context.Background(), Options{Getenv: noEnv, Java: "no-such-java-binary"})
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "JDK") {
		t.Fatalf("err = %v, want ErrMissing naming a JDK", err)
	}
}

// fakeJava is an executable that does nothing: Start looks for a Java runtime before the jars.
func fakeJava(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "java")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMissingJarsNameThePackages(t *testing.T) {
	t.Parallel()
	java := fakeJava(t)
	_, err := Start(context.Background(), Options{Getenv: noEnv, SDKRoot: t.TempDir(), Java: java})
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "google-cloud-cli-firestore-emulator") {
		t.Fatalf("err = %v, want ErrMissing naming google-cloud-cli-firestore-emulator", err)
	}
	_, err = Start(context.Background(), Options{Getenv: func(k string) string {
		if k == FirestoreHostEnv {
			return "127.0.0.1:1"
		}
		return ""
	}, SDKRoot: t.TempDir(), Java: java})
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "google-cloud-cli-pubsub-emulator") {
		t.Fatalf("err = %v, want ErrMissing naming google-cloud-cli-pubsub-emulator", err)
	}
}

func TestReusesEmulatorsNamedByTheEnvironment(t *testing.T) {
	t.Parallel()
	env := map[string]string{FirestoreHostEnv: "127.0.0.1:1111", PubSubHostEnv: "127.0.0.1:2222"}
	e, err := Start(context.Background(), Options{Getenv: func(k string) string { return env[k] }, Java: "no-such-java-binary"})
	if err != nil {
		t.Fatal(err)
	}
	if e.FirestoreHost != env[FirestoreHostEnv] || e.PubSubHost != env[PubSubHostEnv] || e.Started() {
		t.Fatalf("got %+v, want the environment's hosts reused", e)
	}
}

// TestStartsAndStopsItsOwnPair starts a fresh pair, checks both answer, and checks that Stop —
// or StopAll, which a process exiting at once calls — leaves no process of their groups running.
func TestStartsAndStopsItsOwnPair(t *testing.T) {
	t.Parallel()
	SkipWithoutJava(t) // it starts two JVMs for each way to stop
	//nolint:paralleltest // StopAll ends every emulator of the process, the other case's too
	for name, stop := range map[string]func(*Emulators){"Stop": (*Emulators).Stop, "StopAll": func(*Emulators) { StopAll() }} {
		t.Run(name, func(t *testing.T) {
			e, err := Start(context.Background(), Options{Getenv: noEnv})
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range []string{e.FirestoreHost, e.PubSubHost} {
				c, err := net.DialTimeout("tcp", h, 2*time.Second)
				if err != nil {
					e.Stop()
					t.Fatalf("dial %s: %v", h, err)
				}
				c.Close()
			}
			pgids := []int{}
			for _, p := range e.procs {
				pgids = append(pgids, p.cmd.Process.Pid)
			}
			stop(e)
			for _, pg := range pgids {
				if err := syscall.Kill(-pg, 0); !errors.Is(err, syscall.ESRCH) {
					t.Errorf("process group %d still exists after %s (kill 0: %v)", pg, name, err)
				}
			}
			for _, h := range []string{e.FirestoreHost, e.PubSubHost} {
				if c, err := net.DialTimeout("tcp", h, time.Second); err == nil {
					c.Close()
					t.Errorf("%s still answers after %s", h, name)
				}
			}
			e.Stop() // after StopAll: nothing left to stop, and no wait
		})
	}
}
