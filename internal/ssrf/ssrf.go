// Package ssrf keeps webhook deliveries from reaching inside the network genbox runs in. A
// callback URL is checked twice: statically when a task is submitted (CheckURL: scheme, port,
// and the host by CheckHost), and again on every delivery by the HTTP client of NewClient, which
// applies CheckHost again, refuses forbidden addresses after DNS resolution and dials only the
// address it checked, so a name that resolves (or rebinds) to an internal address is refused too.
// The client ignores proxy variables, follows no redirects and caps what it reads.
package ssrf

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultTimeout bounds a whole request, response body included.
const DefaultTimeout = 10 * time.Second

// MaxResponseBytes caps what the client reads of a response body: a receiver's answer is only
// its status.
const MaxResponseBytes = 64 << 10

// MaxResponseHeaderBytes caps a response's header block (net/http's default is 10 MiB): a
// receiver answering many deliveries at once with huge headers must not exhaust the memory of
// the service that delivers them. A longer answer fails the attempt.
const MaxResponseHeaderBytes = 16 << 10

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
	ReasonCompat      = "ipv4-compatible ipv6"
	ReasonSiteLocal   = "site-local"
	ReasonTeredo      = "teredo"
	ReasonDiscard     = "discard-only"
	ReasonNumeric     = "numeric host form"
	ReasonInternal    = "internal name"
	ReasonPort        = "port not allowed"
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
	compat    = prefixes("::/96")
	siteLocal = prefixes("fec0::/10")
	teredo    = prefixes("2001::/32")
	discard   = prefixes("100::/64")
	// Special-purpose ranges that no public webhook receiver lives in: "this network", IETF
	// protocol assignments, the documentation ranges, benchmarking, and the reserved class E.
	reserved = prefixes("0.0.0.0/8", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "240.0.0.0/4", "2001:db8::/32")
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
// allowed. IPv4-mapped and IPv4-compatible IPv6 addresses are always refused (no public DNS
// name needs one), with the class of the embedded IPv4 address in the reason, and so are
// Teredo addresses (a tunnel whose far end no check can see); 6to4 addresses are judged by the
// IPv4 address they embed.
func Classify(a netip.Addr) string {
	a = a.WithZone("")
	if a.Is4In6() {
		return qualified(ReasonMapped, a.Unmap())
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
	case in(a, compat):
		b := a.As16()
		return qualified(ReasonCompat, netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
	case in(a, siteLocal):
		return ReasonSiteLocal
	case in(a, teredo):
		return ReasonTeredo
	case in(a, discard):
		return ReasonDiscard
	case in(a, sixToFour):
		b := a.As16()
		if r := Classify(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})); r != "" {
			return Reason6to4 + " of " + r
		}
	}
	return ""
}

// qualified is reason, followed by the class of the IPv4 address embedded, if it has one.
func qualified(reason string, v4 netip.Addr) string {
	if r := Classify(v4); r != "" {
		return reason + " of " + r
	}
	return reason
}

// DefaultPorts are the ports a callback URL may name unless configured otherwise: https's own
// and its usual alternative. A receiver on another port of a public host is unusual, and an
// open port list lets a tenant probe whatever else listens there.
var DefaultPorts = []uint16{443, 8443}

// URLPolicy is the static policy of CheckURL.
type URLPolicy struct {
	// AllowInsecure admits http, localhost and loopback literals, on any port: local use only.
	AllowInsecure bool
	// Ports are the ports a URL may name (its scheme's default when it names none); empty
	// admits any.
	Ports []uint16
}

// CheckURL is the static policy for a callback URL, applied when a task is submitted: an
// absolute https URL (http too when p.AllowInsecure) with a host, no userinfo, and a port of
// p.Ports; its host must pass CheckHost. Names are resolved only when delivering.
func CheckURL(raw string, p URLPolicy) error {
	u, err := url.Parse(raw)
	if err != nil {
		return &BlockedError{Addr: raw, Reason: ReasonURL}
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowInsecure:
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
	if err := CheckHost(host, p.AllowInsecure); err != nil {
		b, _ := IsBlocked(err)
		return &BlockedError{Addr: raw, Reason: b.Reason}
	}
	if p.AllowInsecure || len(p.Ports) == 0 {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	for _, allowed := range p.Ports {
		if port == strconv.Itoa(int(allowed)) {
			return nil
		}
	}
	return &BlockedError{Addr: raw, Reason: ReasonPort + ": " + port}
}

// CheckHost refuses a host, before any resolution, that is a forbidden IP literal, a numeric
// form some resolver reads as an IPv4 address ("2130706433", "0x7f.1", "127.1", "0": refused
// whatever they decode to, as no public receiver is named so), "localhost" or a name under it
// (admitted, like loopback literals, when allowLoopback), a single-label name (a resolver's
// search list completes it inside the network: GCE's "metadata") or a name under a suffix
// reserved for internal use (".internal", as in metadata.google.internal, ".local",
// ".localdomain", ".home.arpa").
func CheckHost(host string, allowLoopback bool) error {
	if a, err := netip.ParseAddr(host); err == nil {
		if r := Classify(a); r != "" && (!allowLoopback || r != ReasonLoopback) {
			return &BlockedError{Addr: host, Reason: r}
		}
		return nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if a, ok := numericHost(name); ok {
		return &BlockedError{Addr: host, Reason: qualifiedAddr(ReasonNumeric, a)}
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		if allowLoopback {
			return nil
		}
		return &BlockedError{Addr: host, Reason: ReasonLocalhost}
	}
	if slices.Contains(strings.Split(name, "."), "") {
		return &BlockedError{Addr: host, Reason: ReasonURL + ": empty label"}
	}
	if !strings.Contains(name, ".") {
		return &BlockedError{Addr: host, Reason: ReasonInternal + ": single label"}
	}
	for _, suffix := range internalSuffixes {
		if strings.HasSuffix(name, suffix) {
			return &BlockedError{Addr: host, Reason: ReasonInternal + ": " + suffix}
		}
	}
	return nil
}

// internalSuffixes are the DNS suffixes reserved for names inside a network.
var internalSuffixes = []string{".internal", ".local", ".localdomain", ".home.arpa"}

// qualifiedAddr is reason with the class of a (when valid and forbidden) appended.
func qualifiedAddr(reason string, a netip.Addr) string {
	if !a.IsValid() {
		return reason
	}
	return qualified(reason, a)
}

// numericHost reports whether name ends in a number, which the WHATWG URL standard (and
// inet_aton, which many resolvers use) reads as an IPv4 address, and returns that address
// when it decodes: one to four parts, each decimal, octal (leading 0) or hex (0x), the last
// filling the remaining bytes.
func numericHost(name string) (netip.Addr, bool) {
	parts := strings.Split(name, ".")
	if !isNumber(parts[len(parts)-1]) {
		return netip.Addr{}, false
	}
	if len(parts) > 4 {
		return netip.Addr{}, true
	}
	var v uint64
	for i, part := range parts {
		n, err := parseNumber(part)
		last := i == len(parts)-1
		width := uint(8)
		if last {
			width = uint(8 * (5 - len(parts)))
		}
		if err != nil || n >= 1<<width {
			return netip.Addr{}, true
		}
		v = v<<width | n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// isNumber reports whether a label is a number in the URL standard's sense: decimal digits, or
// 0x followed by hex digits (none at all too).
func isNumber(label string) bool {
	if h, ok := strings.CutPrefix(label, "0x"); ok {
		return strings.Trim(h, "0123456789abcdef") == ""
	}
	return label != "" && strings.Trim(label, "0123456789") == ""
}

// parseNumber parses one part of a numeric host: decimal, octal with a leading 0, or hex.
func parseNumber(part string) (uint64, error) {
	switch {
	case strings.HasPrefix(part, "0x"):
		if part == "0x" {
			return 0, nil
		}
		return strconv.ParseUint(part[2:], 16, 32)
	case len(part) > 1 && part[0] == '0':
		return strconv.ParseUint(part[1:], 8, 32)
	}
	return strconv.ParseUint(part, 10, 32)
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
// is returned as the response), times out after p.Timeout and reads at most
// MaxResponseHeaderBytes of a response's headers and MaxResponseBytes of its body.
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
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    p.Timeout,
		ResponseHeaderTimeout:  p.Timeout,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
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

// dial refuses a host CheckHost refuses, resolves it, refuses it if any of its addresses is
// forbidden (a name that mixes public and internal addresses is a rebinding attempt), and dials
// the checked addresses in turn.
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
	} else if err := CheckHost(host, p.AllowLoopback); err != nil {
		return nil, err // a task accepted before a rule existed meets it here
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

// redirectTarget is where guard moves a redirect's Location: http.Client parses a Location
// before CheckRedirect can refuse to follow it, so an unparseable one would fail the attempt as a
// transport error (retried to the horizon) instead of refusing the destination.
const redirectTarget = "Genbox-Redirect-Target"

// CheckResponse turns a redirect answer, which the client never follows, into a refusal naming
// where it pointed (its Location, moved aside by the client's transport or not); any other
// response passes.
func CheckResponse(resp *http.Response) error {
	if !isRedirect(resp.StatusCode) {
		return nil
	}
	return &BlockedError{
		Addr:   resp.Request.URL.Redacted(),
		Reason: fmt.Sprintf("%s: %d to %q", ReasonRedirect, resp.StatusCode, cmp.Or(resp.Header.Get(redirectTarget), resp.Header.Get("Location"))),
	}
}

func isRedirect(code int) bool { return code >= 300 && code <= 399 }

// guard refuses disallowed schemes and userinfo before the transport sees a request, moves a
// redirect's Location aside (redirectTarget) and caps the response body.
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
	if isRedirect(resp.StatusCode) {
		// Without a Location the client returns the answer as it is, for CheckResponse.
		resp.Header.Set(redirectTarget, resp.Header.Get("Location"))
		resp.Header.Del("Location")
	}
	resp.Body = cappedBody{Reader: io.LimitReader(resp.Body, MaxResponseBytes), Closer: resp.Body}
	return resp, nil
}

type cappedBody struct {
	io.Reader
	io.Closer
}
