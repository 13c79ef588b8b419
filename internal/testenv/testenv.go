// Package testenv is the one setup genbox's tests share: clients on the emulators (Firestore,
// Pub/Sub with the bus topology bootstrapped) closed when the test ends, a log sink safe for
// concurrent writers, a service's run started in-process and stopped as SIGTERM would (Start), a
// publisher that records what it publishes, a clock the test moves, and a tenant with the webhook receiver that verifies what
// genbox signs for it.
//
// It is imported only from _test.go files (and from no package a service links): it calls
// t.Fatal and holds no production code. Emulator addresses come from the environment
// emulator.Require sets on a test's first use; project ids come from emulator.ProjectID(t), which
// requires them.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/genbox-dev/genbox/internal/bus"
)

// Firestore returns a client of project on the Firestore emulator, closed when t ends.
func Firestore(t testing.TB, project string) *firestore.Client {
	t.Helper()
	fs, err := firestore.NewClient(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	return fs
}

// PubSub returns a client of project on the Pub/Sub emulator, closed when t ends.
func PubSub(t testing.TB, project string) *pubsub.Client {
	t.Helper()
	return pubsubClient(t, project)
}

// Bus returns PubSub(t, project) with genbox's topics and subscriptions bootstrapped in topo.
func Bus(t testing.TB, project string, topo bus.Topology) *pubsub.Client {
	t.Helper()
	return bootstrap(t, PubSub(t, project), topo)
}

// BusAt is Bus on the Pub/Sub emulator at host instead of the environment's: a test's own
// emulator, one it stops and starts again.
func BusAt(t testing.TB, project, host string, topo bus.Topology) *pubsub.Client {
	t.Helper()
	ps := pubsubClient(t, project, option.WithEndpoint(host), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	return bootstrap(t, ps, topo)
}

// pubsubClient returns a client of project made with opts, closed when t ends.
func pubsubClient(t testing.TB, project string, opts ...option.ClientOption) *pubsub.Client {
	t.Helper()
	ps, err := pubsub.NewClient(context.Background(), project, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Close() })
	return ps
}

// bootstrap creates topo's topics and subscriptions; an emulator that does not answer within 30
// seconds fails t rather than hanging it.
func bootstrap(t testing.TB, ps *pubsub.Client, topo bus.Topology) *pubsub.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.Bootstrap(ctx, ps, topo); err != nil {
		t.Fatal(err)
	}
	return ps
}

// LogBuffer is a log sink safe for concurrent writers: a service's stdout in a test.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Addr returns the addr attribute of the first JSON log line whose message is message (a
// service's "<name> started"), or "" while there is none.
func (b *LogBuffer) Addr(message string) string {
	for _, line := range strings.Split(b.String(), "\n") {
		var rec struct {
			Message string `json:"message"`
			Addr    string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Message == message && rec.Addr != "" {
			return rec.Addr
		}
	}
	return ""
}

// Ready polls base's /healthz and then /readyz until each answers 200, failing t if one does not
// within timeout. A readiness probe is asked again until it passes (as Cloud Run's startup probe
// does): the first Firestore read of a cold emulator can outlast a probe's own bound.
func Ready(t testing.TB, base string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, probe := range []string{"/healthz", "/readyz"} {
		for {
			resp, err := http.Get(base + probe)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				err = fmt.Errorf("%s: %s", resp.Status, body)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s%s not ready within %s: %v", base, probe, timeout, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Ended returns a context that has already ended. A service's run given it returns at once
// instead of serving, so a test of its configuration errors fails rather than hangs if the
// configuration is ever accepted.
func Ended() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// Clock is a clock the test moves instead of sleeping: hand its Now to a store.Store.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock that reads t until it is moved.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Add moves the clock on by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Published is one Publish a Publisher recorded.
type Published struct {
	Topic string
	Data  []byte
	Attrs map[string]string
}

// Publisher is a hand-written publisher (the one-method Publisher interface each service
// declares) that records every message it publishes.
type Publisher struct {
	mu          sync.Mutex
	publishFunc func(ctx context.Context, topic string, data []byte, attrs map[string]string) error
	msgs        []Published
}

// SetPublishFunc makes every later Publish call f first: an error it returns fails the Publish,
// which is then not recorded. f runs outside the recorder's lock, so it may block.
func (p *Publisher) SetPublishFunc(f func(ctx context.Context, topic string, data []byte, attrs map[string]string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.publishFunc = f
}

// Publish records the message, after the PublishFunc, if any, let it through.
func (p *Publisher) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error) {
	p.mu.Lock()
	f := p.publishFunc
	p.mu.Unlock()
	if f != nil {
		if err := f(ctx, topic, data, attrs); err != nil {
			return "", err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, Published{Topic: topic, Data: data, Attrs: attrs})
	return "id", nil
}

// All returns every recorded message, oldest first.
func (p *Publisher) All() []Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Published(nil), p.msgs...)
}

// On returns the recorded messages of topic, oldest first.
func (p *Publisher) On(topic string) []Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Published
	for _, m := range p.msgs {
		if m.Topic == topic {
			out = append(out, m)
		}
	}
	return out
}

// Take returns the recorded messages and forgets them.
func (p *Publisher) Take() []Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.msgs
	p.msgs = nil
	return out
}
