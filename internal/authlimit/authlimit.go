// Package authlimit throttles failed authentication: a client whose credentials keep failing is
// refused before its next attempt costs anything (a Firestore read of an unknown API key, a
// comparison with the admin key, a signature check), so requests without a valid credential
// cannot make a service read, compute or log without bound. Failures are counted per client
// address and, as a backstop against a client that changes address, in all; a successful
// attempt costs nothing.
package authlimit

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Config sizes a Limiter.
type Config struct {
	PerClient   rate.Limit // failures a client may add per second, once its burst is spent
	ClientBurst int        // failures a client may have in a row
	Global      rate.Limit // failures every client together may add per second
	GlobalBurst int
	// MaxClients bounds the clients remembered; past it, the clients that have not failed
	// lately are forgotten, and failures beyond that are held by the global limit alone.
	MaxClients int
}

// DefaultConfig is every genbox service's: 20 failures in a row per client, then one a second;
// 50 a second in all, in bursts of 200, per instance.
func DefaultConfig() Config {
	return Config{PerClient: 1, ClientBurst: 20, Global: 50, GlobalBurst: 200, MaxClients: 10000}
}

// Limiter counts failed attempts. Safe for concurrent use.
type Limiter struct {
	cfg    Config
	now    func() time.Time
	global *rate.Limiter

	mu      sync.Mutex
	clients map[string]*rate.Limiter
}

// New returns a Limiter under cfg on the clock now (nil: time.Now).
func New(cfg Config, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{cfg: cfg, now: now, global: rate.NewLimiter(cfg.Global, cfg.GlobalBurst), clients: map[string]*rate.Limiter{}}
}

// Wait returns how long r's client must wait before its next attempt: zero when it may try now.
// It spends nothing; Failed does.
func (l *Limiter) Wait(r *http.Request) time.Duration {
	now := l.now()
	wait := waitFor(l.global, now)
	l.mu.Lock()
	c := l.clients[Client(r)]
	l.mu.Unlock()
	if c != nil {
		wait = max(wait, waitFor(c, now))
	}
	return wait
}

// Failed charges a failed attempt to r's client and to the global limit.
func (l *Limiter) Failed(r *http.Request) {
	now := l.now()
	l.global.AllowN(now, 1)
	if c := l.client(Client(r), now); c != nil {
		c.AllowN(now, 1)
	}
}

// client returns the limiter of client key, making room for it when the table is full; nil
// when no room can be made.
func (l *Limiter) client(key string, now time.Time) *rate.Limiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.clients[key]; ok {
		return c
	}
	if len(l.clients) >= l.cfg.MaxClients {
		for k, c := range l.clients {
			if c.TokensAt(now) >= float64(l.cfg.ClientBurst) { // as good as new: nothing to remember
				delete(l.clients, k)
			}
		}
		if len(l.clients) >= l.cfg.MaxClients {
			return nil
		}
	}
	c := rate.NewLimiter(l.cfg.PerClient, l.cfg.ClientBurst)
	l.clients[key] = c
	return c
}

// waitFor is how long until lim has a whole token at now.
func waitFor(lim *rate.Limiter, now time.Time) time.Duration {
	tokens := lim.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	if lim.Limit() <= 0 {
		return time.Hour
	}
	return time.Duration((1 - tokens) / float64(lim.Limit()) * float64(time.Second))
}

// Client names the client of r: the last address of X-Forwarded-For, which the front end in
// front of the service (Cloud Run's) appends and a client cannot forge, else the peer address;
// an IPv6 address stands for its /64, which one client holds whole.
func Client(r *http.Request) string {
	addr := r.RemoteAddr
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		last := xff[len(xff)-1]
		addr = strings.TrimSpace(last[strings.LastIndexByte(last, ',')+1:])
	}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}
