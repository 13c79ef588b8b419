package service_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/service"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

func open(t *testing.T) *service.Deps {
	t.Helper()
	d, err := service.Open(context.Background(), "svc", emulator.ProjectID(t), func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A request in flight when ctx ends is answered before Serve returns, the pull consumer's context
// is cancelled and waited for, and readiness goes down from the start of the shutdown.
func TestServeDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	d := open(t)
	entered, release := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "done")
	})
	pulling := new(obs.Running)
	pullEnded := make(chan struct{})
	ln, err := service.Listen("0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- d.Serve(ctx, ln, service.Lifecycle{Handler: mux, Grace: 30 * time.Second, Pulling: pulling,
			Pull: func(ctx context.Context) error { <-ctx.Done(); close(pullEnded); return nil }})
	}()
	ready := pulling.Check("pull").Probe
	answered := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/slow")
		if err != nil {
			answered <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- string(b)
	}()
	<-entered
	if err := ready(ctx); err != nil {
		t.Fatalf("pull not ready while running: %v", err)
	}
	cancel()
	<-pullEnded
	if err := ready(context.Background()); err == nil {
		t.Error("pull still ready while shutting down")
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v before the request in flight was answered", err)
	default:
	}
	close(release)
	if got := <-answered; got != "done" {
		t.Errorf("request in flight got %q, want it answered", got)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v after a clean shutdown", err)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Errorf("a second Close = %v, want nil (Serve closed)", err)
	}
}

// Work in flight past the grace is aborted, so the pull consumer returns and Serve with it;
// background jobs run from the start and are stopped only once the pull consumer has returned.
func TestServeAbortsWhatOutlivesGrace(t *testing.T) {
	t.Parallel()
	d := open(t)
	ln, err := service.Listen("0")
	if err != nil {
		t.Fatal(err)
	}
	aborted := make(chan struct{})
	var pullReturned atomic.Bool
	jobStarted := make(chan struct{})
	jobSawPullReturn := make(chan bool, 1)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- d.Serve(ctx, ln, service.Lifecycle{Handler: http.NewServeMux(), Grace: 100 * time.Millisecond,
			Pull: func(ctx context.Context) error {
				<-ctx.Done()
				<-aborted // the in-flight work ends only when aborted
				pullReturned.Store(true)
				return nil
			},
			Abort: func() { close(aborted) },
			Background: []func(context.Context){func(ctx context.Context) {
				close(jobStarted)
				<-ctx.Done()
				jobSawPullReturn <- pullReturned.Load()
			}}})
	}()
	<-jobStarted
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve = %v after an aborted shutdown", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve still running 30 s after shutdown began: the work in flight was not aborted")
	}
	if !<-jobSawPullReturn {
		t.Error("the background job was stopped before the pull consumer returned")
	}
}

// A pull consumer that fails ends Serve with its error, without ctx ending.
func TestServeEndsWhenPullFails(t *testing.T) {
	t.Parallel()
	d := open(t)
	boom := errors.New("subscription gone")
	ln, err := service.Listen("0")
	if err != nil {
		t.Fatal(err)
	}
	err = d.Serve(context.Background(), ln, service.Lifecycle{Handler: http.NewServeMux(), Grace: time.Second,
		Pull: func(context.Context) error { return boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("Serve = %v, want the pull error", err)
	}
	if _, err := http.Get("http://" + ln.Addr().String() + "/"); err == nil {
		t.Error("the server still answers after Serve returned")
	}
}

func TestErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	if _, err := service.Listen("-1"); err == nil || !strings.Contains(err.Error(), "PORT") {
		t.Errorf("Listen = %v, want an error naming PORT", err)
	}
	env := map[string]string{"GENBOX_TELEMETRY": "jaeger"}
	if _, err := service.Open(context.Background(), "svc", "p", func(k string) string { return env[k] }, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "GENBOX_TELEMETRY") {
		t.Errorf("Open = %v, want an error naming GENBOX_TELEMETRY", err)
	}
}
