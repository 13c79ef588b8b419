package testenv

import (
	"context"
	"net"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
)

// Service is a service's run started in-process by Start.
type Service struct {
	// Log is the run's stdout.
	Log    *LogBuffer
	cancel context.CancelFunc
	ended  chan struct{} // closed once run has returned and err is set
	err    error
}

// Start runs run in a goroutine as the service's main would, with env as its environment. The
// run is stopped, and waited for, when t ends.
func Start(t testing.TB, run service.RunFunc, env map[string]string) *Service {
	t.Helper()
	return StartWith(t, run, func(k string) string { return env[k] })
}

// StartWith is Start with getenv as the run's environment: a test that records what the
// service reads.
func StartWith(t testing.TB, run service.RunFunc, getenv func(string) string) *Service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{Log: &LogBuffer{}, cancel: cancel, ended: make(chan struct{})}
	go func() {
		s.err = run(ctx, getenv, s.Log)
		close(s.ended)
	}()
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// Stop ends the run's context, as SIGTERM does, waits for run to return and returns its error.
// It may be called again, and from any goroutine: each call returns the same error.
func (s *Service) Stop() error {
	s.cancel()
	<-s.ended
	return s.err
}

// Started waits for the run to log "<name> started" and returns its address as a base URL
// (http://127.0.0.1:port). It fails t if the run ends first or nothing is logged within timeout.
func (s *Service) Started(t testing.TB, name string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if addr := s.Log.Addr(name + " started"); addr != "" {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("%s started on %q: %v", name, addr, err)
			}
			return "http://127.0.0.1:" + port
		}
		select {
		case <-s.ended:
			t.Fatalf("%s ended before it started: %v\n%s", name, s.err, s.Log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not start within %s\n%s", name, timeout, s.Log.String())
		}
	}
}

// StopClean stops the run and fails t unless run returned nil, with the run's log.
func (s *Service) StopClean(t testing.TB) {
	t.Helper()
	if err := s.Stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, s.Log.String())
	}
}

// PushTo bootstraps topo again with each of subs pushed to endpoint, as a push consumer's
// subscriptions are once its address is known. An emulator that does not answer within 30
// seconds fails t.
func PushTo(t testing.TB, ps *pubsub.Client, topo bus.Topology, endpoint string, subs ...string) {
	t.Helper()
	topo.PushEndpoints = map[string]string{}
	for _, sub := range subs {
		topo.PushEndpoints[sub] = endpoint
	}
	bootstrap(t, ps, topo)
}

// EachConsumer runs test as a parallel subtest for each way a service can consume its
// subscriptions (modes: push and pull).
func EachConsumer(t *testing.T, test func(t *testing.T, mode string), modes ...string) {
	t.Helper()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			test(t, mode)
		})
	}
}

// Project is one test's project on the emulators: Pub/Sub with a topology bootstrapped, and a
// store on Firestore. Its clients close when the test ends.
type Project struct {
	ID     string
	PubSub *pubsub.Client
	Store  *store.Store
}

// NewProject returns a fresh project (emulator.ProjectID) with topo bootstrapped.
func NewProject(t testing.TB, topo bus.Topology) Project {
	t.Helper()
	id := emulator.ProjectID(t)
	return Project{ID: id, PubSub: Bus(t, id, topo), Store: store.New(Firestore(t, id))}
}
