package emulator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func noEnv(string) string { return "" }

// fakeJava is an executable that does nothing: Start looks for a Java runtime before the jars.
func fakeJava(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "java")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// write creates the file at dir/rel with content, and its directories.
func write(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

// fakeSDK is a Google Cloud CLI root: "components" (its own component manager), "package" (from
// a system package: the manager is off) or "none" (no CLI), holding the emulators named in has.
func fakeSDK(t *testing.T, kind string, has ...string) string {
	t.Helper()
	root := t.TempDir()
	if kind != "none" {
		write(t, root, "lib/googlecloudsdk/core/config.json", fmt.Sprintf(`{"disable_updater": %v}`, kind == "package"))
	}
	for _, h := range has {
		switch h {
		case "firestore":
			write(t, root, "platform/cloud-firestore-emulator/cloud-firestore-emulator.jar", "")
		case "pubsub":
			write(t, root, "platform/pubsub-emulator/bin/cloud-pubsub-emulator", "#!/bin/sh\n")
		}
	}
	return root
}

// fakeSystem is an /etc: os-release with id, and apt's sources naming Google's repository when
// googleRepo.
func fakeSystem(t *testing.T, id string, googleRepo bool) string {
	t.Helper()
	sys := t.TempDir()
	write(t, sys, "etc/os-release", "NAME=x\nID="+id+"\n")
	write(t, sys, "etc/apt/sources.list.d/debian.sources", "URIs: http://deb.debian.org/debian\n")
	if googleRepo {
		write(t, sys, "etc/apt/sources.list.d/google-cloud-sdk.list", "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main\n")
	}
	return sys
}

// Without the emulators or Java, Start says what is missing and how this machine installs it —
// gcloud components where the CLI manages its own, apt on Debian and Ubuntu (Java in the same
// command) — instead of naming a jar path.
func TestMissingSaysWhatAndHowToInstall(t *testing.T) {
	t.Parallel()
	apt := sudo() + "apt-get install -y "
	for _, tc := range []struct {
		name   string
		sdk    string
		system string
		java   bool
		env    map[string]string
		want   []string
		what   []string // named in the message
	}{
		{"components install", fakeSDK(t, "components"), fakeSystem(t, "debian", true), true, nil,
			[]string{"gcloud components install cloud-firestore-emulator pubsub-emulator"}, []string{"the Firestore emulator and the Pub/Sub emulator"}},
		{"components install lacking Pub/Sub", fakeSDK(t, "components", "firestore"), fakeSystem(t, "fedora", false), true, nil,
			[]string{"gcloud components install pubsub-emulator"}, []string{"the Pub/Sub emulator (the emulators were looked for in the Google Cloud CLI at "}},
		{"CLI from apt, no Java", fakeSDK(t, "package"), fakeSystem(t, "debian", true), false, nil,
			[]string{apt + "google-cloud-cli-firestore-emulator google-cloud-cli-pubsub-emulator openjdk-17-jre-headless"},
			[]string{"the Firestore emulator, the Pub/Sub emulator and a Java 17 runtime (", "; java was looked for on PATH). Install them with:"}},
		{"Ubuntu with Google's repository, no CLI", fakeSDK(t, "none"), fakeSystem(t, "ubuntu", true), true, nil,
			[]string{apt + "google-cloud-cli-firestore-emulator google-cloud-cli-pubsub-emulator"}, nil},
		{"Debian without Google's repository", fakeSDK(t, "none"), fakeSystem(t, "debian", false), true, nil,
			[]string{addGoogleAptRepo, apt + "google-cloud-cli-firestore-emulator google-cloud-cli-pubsub-emulator"}, []string{"docs/development.md", "there is no Google Cloud CLI at "}},
		{"another system, nothing installed", fakeSDK(t, "none"), fakeSystem(t, "fedora", false), false, nil,
			[]string{installGoogleCloud, "gcloud components install cloud-firestore-emulator pubsub-emulator", installJava}, nil},
		{"components install, no Java", fakeSDK(t, "components", "firestore", "pubsub"), fakeSystem(t, "fedora", false), false, nil,
			[]string{installJava}, []string{"not installed: a Java 17 runtime (java was looked for on PATH). Install it with:"}},
		{"Debian, only Pub/Sub to start", fakeSDK(t, "package"), fakeSystem(t, "debian", true), true, map[string]string{FirestoreHostEnv: "127.0.0.1:1"},
			[]string{apt + "google-cloud-cli-pubsub-emulator"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			java := "no-such-java-binary"
			if tc.java {
				java = fakeJava(t)
			}
			_, err := Start(context.Background(), Options{Getenv: func(k string) string { return tc.env[k] }, SDKRoot: tc.sdk, Java: java, System: tc.system})
			var m *MissingError
			if !errors.As(err, &m) || !errors.Is(err, ErrMissing) {
				t.Fatalf("err = %v, want a *MissingError", err)
			}
			if !slices.Equal(m.Install, tc.want) {
				t.Errorf("install steps\n%q\nwant\n%q", m.Install, tc.want)
			}
			msg := err.Error()
			for _, w := range append(tc.what, tc.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("the message lacks %q:\n%s", w, msg)
				}
			}
			if strings.Contains(msg, ".jar") {
				t.Errorf("the message names a jar path:\n%s", msg)
			}
		})
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
