// Package authlimit throttles failed authentication. A credential is always checked first, and
// a valid one is never refused here, whatever anyone's failures; a credential that fails is
// counted against its client address and, as a backstop against a client that changes address,
// against every client together. Past either limit a failure is answered 429 with Retry-After
// instead of its refusal, and the services leave it out of their logs, so failing requests
// cannot make a service log without bound.
package authlimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// EnvTrustedProxyHops names how many addresses the front ends of a service append to
// X-Forwarded-For (Config.TrustedHops), read by every service that throttles failures.
const EnvTrustedProxyHops = "GENBOX_TRUSTED_PROXY_HOPS"

// DefaultTrustedHops is Cloud Run's front end alone: it appends the address it was called from.
const DefaultTrustedHops = 1

// MaxTrustedHops bounds Config.TrustedHops: no genbox setup puts more proxies in front.
const MaxTrustedHops = 10

// CheckTrustedHops reports a hop count out of range, naming EnvTrustedProxyHops.
func CheckTrustedHops(n int) error {
	if n < 0 || n > MaxTrustedHops {
		return fmt.Errorf("%s: %d is not 0 to %d", EnvTrustedProxyHops, n, MaxTrustedHops)
	}
	return nil
}

// Config sizes a Limiter.
type Config struct {
	PerClient   rate.Limit // failures a client may add per second, once its burst is spent
	ClientBurst int        // failures a client may have in a row
	Global      rate.Limit // failures every client together may add per second
	GlobalBurst int
	// MaxClients bounds the clients remembered; past it, the clients that have not failed
	// lately are forgotten, and failures beyond that are held by the global limit alone.
	MaxClients int
	// TrustedHops is how many addresses the front ends in front of the service append to
	// X-Forwarded-For (see Client): 1 on Cloud Run, 2 behind an external HTTPS load balancer.
	TrustedHops int
}

// DefaultConfig is every genbox service's: 20 failures in a row per client, then one a second;
// 50 a second in all, in bursts of 200, per instance; the client named by Cloud Run's front end.
func DefaultConfig() Config {
	return Config{PerClient: 1, ClientBurst: 20, Global: 50, GlobalBurst: 200, MaxClients: 10000, TrustedHops: DefaultTrustedHops}
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
	if c := l.client(Client(r, l.cfg.TrustedHops), now); c != nil && !c.AllowN(now, 1) {
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

// Client names the client of r. Each front end in front of the service appends the address it
// was called from to X-Forwarded-For, and what comes before is whatever the client sent; so the
// client is the address hops entries from the right (Cloud Run's front end appends one; an
// external HTTPS load balancer two, the client's and its own), or the leftmost when there are
// fewer (a request that reached the service past the balancer). With hops 0, or no header, it is
// the peer address. An IPv6 address stands for its /64, which one client holds whole.
func Client(r *http.Request, hops int) string {
	addr := r.RemoteAddr
	if hops > 0 {
		var entries []string
		for _, v := range r.Header.Values("X-Forwarded-For") {
			entries = append(entries, strings.Split(v, ",")...)
		}
		if len(entries) > 0 {
			addr = strings.TrimSpace(entries[max(len(entries)-hops, 0)])
		}
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
