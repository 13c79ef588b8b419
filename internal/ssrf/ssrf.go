// Package ssrf keeps webhook deliveries from reaching inside the network genbox runs in. A
// callback URL is checked twice: statically when a task is submitted (CheckURL), and again on
// every delivery by the HTTP client of NewClient, whose dialer refuses forbidden addresses after
// DNS resolution and dials only the address it checked, so a name that resolves (or rebinds) to
// an internal address is refused too. The client ignores proxy variables, follows no redirects
// and caps what it reads.
package ssrf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// DefaultTimeout bounds a whole request, response body included.
const DefaultTimeout = 10 * time.Second

// MaxResponseBytes caps what the client reads of a response body: a receiver's answer is only
// its status.
const MaxResponseBytes = 64 << 10

// Reasons a BlockedError gives.
const (
	ReasonScheme      = "scheme not allowed"
	ReasonURL         = "malformed url"
	ReasonUserinfo    = "userinfo in url"
	ReasonNoHost      = "no host"
	ReasonLocalhost   = "localhost"
	ReasonLoopback    = "loopback"
	ReasonPrivate     = "private"
	ReasonLinkLocal   = "link-local"
	ReasonCGNAT       = "cgnat"
	ReasonMetadata    = "cloud metadata"
	ReasonMapped      = "ipv4-mapped ipv6"
	ReasonNAT64       = "nat64"
	Reason6to4        = "6to4"
	ReasonUnspecified = "unspecified"
	ReasonMulticast   = "multicast"
	ReasonBroadcast   = "broadcast"
	ReasonReserved    = "reserved"
	ReasonNoAddress   = "no address"
	ReasonRedirect    = "redirect not followed"
)

// BlockedError is every refusal: what was refused and why.
type BlockedError struct {
	Addr   string // the URL, host or address refused
	Reason string // one of the Reason constants, possibly qualified
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("ssrf: refused %s: %s", e.Addr, e.Reason)
}

// IsBlocked reports whether err is, or wraps, a refusal, and returns it.
func IsBlocked(err error) (*BlockedError, bool) {
	var b *BlockedError
	ok := errors.As(err, &b)
	return b, ok
}

var (
	metadataV4 = netip.MustParseAddr("169.254.169.254")
	metadataV6 = netip.MustParseAddr("fd00:ec2::254")
	broadcast  = netip.MustParseAddr("255.255.255.255")
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var (
	private   = prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
	cgnat     = prefixes("100.64.0.0/10")
	nat64     = prefixes("64:ff9b::/96", "64:ff9b:1::/48")
	sixToFour = prefixes("2002::/16")
	// Special-purpose IPv4 ranges that no public webhook receiver lives in: "this network",
	// IETF protocol assignments, benchmarking, and the reserved class E.
	reserved = prefixes("0.0.0.0/8", "192.0.0.0/24", "198.18.0.0/15", "240.0.0.0/4")
)

func in(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Classify returns why an address is forbidden as a webhook destination, or "" when it is
// allowed. IPv4-mapped IPv6 addresses are always refused (no public DNS name needs one), with
// the class of the embedded IPv4 address in the reason; 6to4 addresses are judged by theirs.
func Classify(a netip.Addr) string {
	a = a.WithZone("")
	if a.Is4In6() {
		reason := ReasonMapped
		if r := Classify(a.Unmap()); r != "" {
			reason += " of " + r
		}
		return reason
	}
	switch {
	case !a.IsValid():
		return ReasonNoAddress
	case a.IsUnspecified():
		return ReasonUnspecified
	case a.IsLoopback():
		return ReasonLoopback
	case a == metadataV4 || a == metadataV6:
		return ReasonMetadata
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return ReasonLinkLocal
	case a == broadcast:
		return ReasonBroadcast
	case a.IsMulticast():
		return ReasonMulticast
	case in(a, private):
		return ReasonPrivate
	case in(a, cgnat):
		return ReasonCGNAT
	case in(a, nat64):
		return ReasonNAT64
	case in(a, reserved):
		return ReasonReserved
	case in(a, sixToFour):
		b := a.As16()
		if r := Classify(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})); r != "" {
			return Reason6to4 + " of " + r
		}
	}
	return ""
}

// CheckURL is the static policy for a callback URL, applied when a task is submitted: an
// absolute https URL (http too when allowInsecure) with a host and no userinfo; a host that is
// an IP literal must not be forbidden; "localhost" is refused. allowInsecure is for local use:
// it also admits localhost and loopback literals. Names are resolved only when delivering.
func CheckURL(raw string, allowInsecure bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return &BlockedError{Addr: raw, Reason: ReasonURL}
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && allowInsecure:
	default:
		return &BlockedError{Addr: raw, Reason: ReasonScheme + ": " + strings.ToLower(u.Scheme)}
	}
	if u.User != nil {
		return &BlockedError{Addr: raw, Reason: ReasonUserinfo}
	}
	host := u.Hostname()
	if host == "" {
		return &BlockedError{Addr: raw, Reason: ReasonNoHost}
	}
	lower := strings.TrimSuffix(strings.ToLower(host), ".")
	if lower == "localhost" || strings.HasSuffix(lower, ".localhost") {
		if allowInsecure {
			return nil
		}
		return &BlockedError{Addr: raw, Reason: ReasonLocalhost}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return nil // a name: judged after resolution, on every delivery
	}
	if r := Classify(a); r != "" && (!allowInsecure || r != ReasonLoopback) {
		return &BlockedError{Addr: raw, Reason: r}
	}
	return nil
}

// Resolver looks names up; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// Policy configures NewClient.
type Policy struct {
	// AllowHTTP admits http URLs (local use only); https is always admitted.
	AllowHTTP bool
	// AllowLoopback admits loopback addresses (local use and tests only); nothing else forbidden
	// is ever admitted.
	AllowLoopback bool
	// Timeout bounds a request; zero means DefaultTimeout.
	Timeout time.Duration
	// Resolver resolves names; nil means net.DefaultResolver.
	Resolver Resolver

	// allow, set only by this package's tests, admits one exact address as if it were public,
	// so a local listener can play a public receiver while every other check stays in force.
	allow func(netip.AddrPort) bool
}

// check refuses a resolved destination the policy forbids.
func (p Policy) check(ap netip.AddrPort) error {
	if p.allow != nil && p.allow(ap) {
		return nil
	}
	r := Classify(ap.Addr())
	if r == "" || (p.AllowLoopback && r == ReasonLoopback) {
		return nil
	}
	return &BlockedError{Addr: ap.String(), Reason: r}
}

// NewClient returns an HTTP client for webhook deliveries under p: it refuses forbidden
// destinations after DNS resolution (and again in the dialer's Control hook, on the very
// address the socket connects to), ignores HTTP_PROXY/HTTPS_PROXY, follows no redirect (a 3xx
// is returned as the response), times out after p.Timeout and reads at most MaxResponseBytes of
// a response body.
func NewClient(p Policy) *http.Client {
	if p.Resolver == nil {
		p.Resolver = net.DefaultResolver
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultTimeout
	}
	d := newDialer(p)
	tr := &http.Transport{
		Proxy: nil, // a proxy variable must not route around the dialer's check
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dial(ctx, p, d, network, addr)
		},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   p.Timeout,
		ResponseHeaderTimeout: p.Timeout,
	}
	return &http.Client{
		Transport: &guard{p: p, rt: tr},
		Timeout:   p.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// newDialer returns a dialer whose Control hook checks the very address each socket connects
// to: the last line, should anything reach the dialer without passing dial's check.
func newDialer(p Policy) *net.Dialer {
	return &net.Dialer{
		Timeout: p.Timeout,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return &BlockedError{Addr: address, Reason: ReasonNoAddress}
			}
			return p.check(ap)
		},
	}
}

// dial resolves addr's host, refuses it if any of its addresses is forbidden (a name that
// mixes public and internal addresses is a rebinding attempt), and dials the checked addresses
// in turn.
func dial(ctx context.Context, p Policy, d *net.Dialer, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &BlockedError{Addr: addr, Reason: ReasonURL}
	}
	port, err := net.LookupPort(network, portStr)
	if err != nil {
		return nil, &BlockedError{Addr: addr, Reason: ReasonURL}
	}
	var ips []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{a}
	} else {
		ips, err = p.Resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("ssrf: resolve %s: %w", host, err)
		}
	}
	if len(ips) == 0 {
		return nil, &BlockedError{Addr: host, Reason: ReasonNoAddress}
	}
	targets := make([]netip.AddrPort, len(ips))
	for i, ip := range ips {
		targets[i] = netip.AddrPortFrom(ip, uint16(port))
		if err := p.check(targets[i]); err != nil {
			b, _ := IsBlocked(err)
			return nil, &BlockedError{Addr: host + " (" + b.Addr + ")", Reason: b.Reason}
		}
	}
	var errs []error
	for _, ap := range targets {
		c, err := d.DialContext(ctx, network, ap.String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// CheckResponse turns a redirect answer, which the client never follows, into a refusal naming
// where it pointed; any other response passes.
func CheckResponse(resp *http.Response) error {
	if resp.StatusCode < 300 || resp.StatusCode > 399 {
		return nil
	}
	return &BlockedError{
		Addr:   resp.Request.URL.Redacted(),
		Reason: fmt.Sprintf("%s: %d to %q", ReasonRedirect, resp.StatusCode, resp.Header.Get("Location")),
	}
}

// guard refuses disallowed schemes and userinfo before the transport sees a request, and caps
// the response body.
type guard struct {
	p  Policy
	rt http.RoundTripper
}

func (g *guard) RoundTrip(r *http.Request) (*http.Response, error) {
	u := r.URL
	if u.Scheme != "https" && (u.Scheme != "http" || !g.p.AllowHTTP) {
		return nil, &BlockedError{Addr: u.Redacted(), Reason: ReasonScheme + ": " + u.Scheme}
	}
	if u.User != nil {
		return nil, &BlockedError{Addr: u.Redacted(), Reason: ReasonUserinfo}
	}
	resp, err := g.rt.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = cappedBody{Reader: io.LimitReader(resp.Body, MaxResponseBytes), Closer: resp.Body}
	return resp, nil
}

type cappedBody struct {
	io.Reader
	io.Closer
}
