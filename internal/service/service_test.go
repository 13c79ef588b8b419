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
	pullStopping, pullRelease := make(chan struct{}), make(chan struct{})
	ln, err := service.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- d.Serve(ctx, ln, service.Lifecycle{Handler: mux, Grace: 30 * time.Second,
			Pull: func(ctx context.Context) error { <-ctx.Done(); close(pullStopping); <-pullRelease; return nil }})
	}()
	base := "http://" + ln.Addr().String()
	answered := make(chan string, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			answered <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- string(b)
	}()
	<-entered
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz while pulling = %d %s, want 200", code, body)
	}
	cancel()
	<-pullStopping
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"pull"`) {
		t.Errorf("/readyz while shutting down = %d %s, want 503 naming the pull", code, body)
	}
	close(pullRelease)
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

// get GETs url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Every service answers the probes beside its routes: /healthz always, /readyz with its checks,
// naming the one that failed without its error.
func TestServeAnswersTheProbes(t *testing.T) {
	t.Parallel()
	d := open(t)
	ln, err := service.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /own", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "own") })
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- d.Serve(ctx, ln, service.Lifecycle{Handler: mux, Grace: time.Second, Ready: []obs.Check{
			{Name: "up", Probe: func(context.Context) error { return nil }},
			{Name: "down", Probe: func(context.Context) error { return errors.New("10.0.0.7: connection refused") }},
		}})
	}()
	base := "http://" + ln.Addr().String()
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/healthz = %d %s, want 200 ok", code, body)
	}
	code, body := get(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"down":"failed"`) || strings.Contains(body, `"up"`) ||
		strings.Contains(body, "10.0.0.7") {
		t.Errorf("/readyz = %d %s, want 503 naming only the failed check, without its error", code, body)
	}
	if code, body := get(t, base+"/own"); code != http.StatusOK || body != "own" {
		t.Errorf("/own = %d %s, want the service's route", code, body)
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve = %v", err)
	}
}

// Work in flight past the grace is aborted, so the pull consumer returns and Serve with it;
// background jobs run from the start and are stopped only once the pull consumer has returned.
func TestServeAbortsWhatOutlivesGrace(t *testing.T) {
	t.Parallel()
	d := open(t)
	ln, err := service.Listen(0)
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
	ln, err := service.Listen(0)
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
	if _, err := service.Listen(-1); err == nil || !strings.Contains(err.Error(), "PORT") {
		t.Errorf("Listen = %v, want an error naming PORT", err)
	}
	env := map[string]string{"GENBOX_TELEMETRY": "jaeger"}
	if _, err := service.Open(context.Background(), "svc", "p", func(k string) string { return env[k] }, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "GENBOX_TELEMETRY") {
		t.Errorf("Open = %v, want an error naming GENBOX_TELEMETRY", err)
	}
}
