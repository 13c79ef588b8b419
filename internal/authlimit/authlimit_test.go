package authlimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// clock is a settable time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func from(remote string, xff ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for _, v := range xff {
		r.Header.Add("X-Forwarded-For", v)
	}
	return r
}

func TestClientFailuresAreThrottled(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(Config{PerClient: 1, ClientBurst: 3, Global: 100, GlobalBurst: 100, MaxClients: 10, TrustedHops: 1}, c.now)
	bad, other := from("198.51.100.7:5000"), from("198.51.100.8:5000")
	for i := range 3 {
		if w := l.Failed(bad); w != 0 {
			t.Fatalf("failure %d: wait %v within the burst", i+1, w)
		}
	}
	if w := l.Failed(bad); w != time.Second {
		t.Fatalf("past the burst: wait %v, want 1s (one failure a second)", w)
	}
	if w := l.Failed(other); w != 0 {
		t.Fatalf("another client waits %v for the first one's failures", w)
	}
	c.t = c.t.Add(time.Second)
	if w := l.Failed(bad); w != 0 {
		t.Fatalf("a second later: wait %v, want 0", w)
	}
}

func TestGlobalFailuresAreThrottled(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(Config{PerClient: 1, ClientBurst: 100, Global: 2, GlobalBurst: 4, MaxClients: 10, TrustedHops: 1}, c.now)
	for i := range 4 {
		if w := l.Failed(from(fmt.Sprintf("192.0.2.%d:1", i+1))); w != 0 { // a client changing address
			t.Fatalf("failure %d: wait %v within the global burst", i+1, w)
		}
	}
	if w := l.Failed(from("203.0.113.9:1")); w != 500*time.Millisecond {
		t.Fatalf("past the global burst: a fresh client waits %v, want 500ms", w)
	}
}

// A client past its own limit does not spend every client's budget as well: its failures
// beyond its burst cannot throttle the others.
func TestThrottledClientSpendsNotEveryonesBudget(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(Config{PerClient: 1, ClientBurst: 1, Global: 1, GlobalBurst: 3, MaxClients: 10, TrustedHops: 1}, c.now)
	for range 10 {
		l.Failed(from("198.51.100.7:1"))
	}
	for _, addr := range []string{"192.0.2.1:1", "192.0.2.2:1"} {
		if w := l.Failed(from(addr)); w != 0 {
			t.Errorf("%s after another client's ten failures: wait %v, want 0 (one of theirs counted in all)", addr, w)
		}
	}
}

func TestClientTableIsBounded(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(Config{PerClient: 1, ClientBurst: 1, Global: 1000, GlobalBurst: 1000, MaxClients: 2, TrustedHops: 1}, c.now)
	l.Failed(from("192.0.2.1:1"))
	l.Failed(from("192.0.2.2:1"))
	l.Failed(from("192.0.2.3:1")) // no room: held by the global limit alone
	if n := len(l.clients); n != 2 {
		t.Fatalf("%d clients remembered, want at most 2", n)
	}
	c.t = c.t.Add(time.Minute) // the first two are as good as new: forgotten to make room
	l.Failed(from("192.0.2.4:1"))
	if n := len(l.clients); n != 1 {
		t.Fatalf("%d clients remembered after the others recovered, want 1", n)
	}
	if w := l.Failed(from("192.0.2.4:1")); w == 0 {
		t.Fatal("the newest client's first failure was not counted")
	}
}

func TestClient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r    *http.Request
		hops int
		want string
	}{
		{from("198.51.100.7:5000"), 1, "198.51.100.7"},
		{from("[2001:db8:1:2:3::4]:5000"), 1, "2001:db8:1:2::/64"},
		{from("[::ffff:198.51.100.7]:5000"), 1, "198.51.100.7"},
		{from("169.254.1.1:5000", "203.0.113.5"), 1, "203.0.113.5"},
		{from("169.254.1.1:5000", "6.6.6.6, 203.0.113.5"), 1, "203.0.113.5"}, // the client's own entry is ignored
		{from("169.254.1.1:5000", "6.6.6.6", "203.0.113.5"), 1, "203.0.113.5"},
		{from("169.254.1.1:5000", "2001:db8::1"), 1, "2001:db8::/64"},
		// Behind a load balancer: the client, then the balancer.
		{from("169.254.1.1:5000", "203.0.113.5, 34.120.0.1"), 2, "203.0.113.5"},
		{from("169.254.1.1:5000", "6.6.6.6, 203.0.113.5, 34.120.0.1"), 2, "203.0.113.5"},
		{from("169.254.1.1:5000", "6.6.6.6, 203.0.113.5", "34.120.0.1"), 2, "203.0.113.5"},
		{from("169.254.1.1:5000", "203.0.113.5"), 2, "203.0.113.5"}, // past the balancer: the one entry there is
		{from("169.254.1.1:5000", "203.0.113.5, 34.120.0.1"), 0, "169.254.1.1"},
		{from("pipe"), 1, "pipe"},
	} {
		if got := Client(tc.r, tc.hops); got != tc.want {
			t.Errorf("Client(%s, %v, %d) = %q, want %q", tc.r.RemoteAddr, tc.r.Header.Values("X-Forwarded-For"), tc.hops, got, tc.want)
		}
	}
}

func TestCheckTrustedHops(t *testing.T) {
	t.Parallel()
	for n, ok := range map[int]bool{-1: false, 0: true, 1: true, 2: true, MaxTrustedHops: true, MaxTrustedHops + 1: false} {
		if err := CheckTrustedHops(n); (err == nil) != ok {
			t.Errorf("CheckTrustedHops(%d) = %v, want ok %v", n, err, ok)
		}
	}
}
