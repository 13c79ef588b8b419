// Package authlimit throttles failed authentication. A credential is always checked first, and
// a valid one is never refused here, whatever anyone's failures; a credential that fails is
// counted against its client address and, as a backstop against a client that changes address,
// against every client together. Past either limit a failure is answered 429 with Retry-After
// instead of its refusal, and the services leave it out of their logs, so failing requests
// cannot make a service log without bound.
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

// Failed counts a failed attempt of r's client and returns how long the client should wait
// before its next one: zero while its failures and every client's are within their limits. A
// failure past the client's own limit is not counted again in every client's.
func (l *Limiter) Failed(r *http.Request) time.Duration {
	now := l.now()
	if c := l.client(Client(r), now); c != nil && !c.AllowN(now, 1) {
		return waitFor(c, now)
	}
	if !l.global.AllowN(now, 1) {
		return waitFor(l.global, now)
	}
	return 0
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
