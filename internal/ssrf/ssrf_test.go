package ssrf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr, want string
	}{
		{"127.0.0.1", ReasonLoopback},
		{"127.8.9.10", ReasonLoopback},
		{"::1", ReasonLoopback},
		{"10.0.0.1", ReasonPrivate},
		{"172.16.0.1", ReasonPrivate},
		{"172.31.255.255", ReasonPrivate},
		{"192.168.1.1", ReasonPrivate},
		{"fc00::1", ReasonPrivate},
		{"fd12:3456::1", ReasonPrivate},
		{"169.254.1.1", ReasonLinkLocal},
		{"fe80::1", ReasonLinkLocal},
		{"fe80::1%eth0", ReasonLinkLocal},
		{"100.64.0.1", ReasonCGNAT},
		{"100.127.255.255", ReasonCGNAT},
		{"169.254.169.254", ReasonMetadata},
		{"fd00:ec2::254", ReasonMetadata},
		{"::ffff:127.0.0.1", ReasonMapped + " of " + ReasonLoopback},
		{"::ffff:10.1.2.3", ReasonMapped + " of " + ReasonPrivate},
		{"::ffff:8.8.8.8", ReasonMapped},
		{"64:ff9b::7f00:1", ReasonNAT64},
		{"64:ff9b:1::1", ReasonNAT64},
		{"2002:7f00:1::", Reason6to4 + " of " + ReasonLoopback},
		{"0.0.0.0", ReasonUnspecified},
		{"::", ReasonUnspecified},
		{"0.1.2.3", ReasonReserved},
		{"240.0.0.1", ReasonReserved},
		{"224.0.0.1", ReasonLinkLocal},
		{"239.1.1.1", ReasonMulticast},
		{"ff02::1", ReasonLinkLocal},
		{"ff0e::1", ReasonMulticast},
		{"255.255.255.255", ReasonBroadcast},
		{"::7f00:1", ReasonCompat + " of " + ReasonLoopback},
		{"::a00:1", ReasonCompat + " of " + ReasonPrivate},
		{"::808:808", ReasonCompat},
		{"::ffff:0:0", ReasonMapped + " of " + ReasonUnspecified},
		{"fec0::1", ReasonSiteLocal},
		{"feff::1", ReasonSiteLocal},
		{"2001::1", ReasonTeredo},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", ReasonTeredo},
		{"100::1", ReasonDiscard},
		{"192.0.2.1", ReasonReserved},
		{"2001:db8::1", ReasonReserved},
		{"8.8.8.8", ""},
		{"2001:1::1", ""},
		{"100:0:0:1::1", ""},
		{"100.63.255.255", ""},
		{"172.32.0.1", ""},
		{"2001:4860:4860::8888", ""},
		{"2002:808:808::", ""},
	}
	for _, tc := range tests {
		if got := Classify(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Classify(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	strict := URLPolicy{Ports: DefaultPorts}
	insecure := URLPolicy{AllowInsecure: true, Ports: DefaultPorts}
	anyPort := URLPolicy{}
	tests := []struct {
		url  string
		p    URLPolicy
		want string // reason prefix; "" means allowed
	}{
		{"https://example.com/hook", strict, ""},
		{"https://example.com:8443/hook?x=1", strict, ""},
		{"https://example.com:443/hook", strict, ""},
		{"https://93.184.216.34/hook", strict, ""},
		{"https://example.com./hook", strict, ""},
		{"http://example.com/hook", strict, ReasonScheme},
		{"http://example.com/hook", insecure, ""},
		{"ftp://example.com/", insecure, ReasonScheme},
		{"/relative", strict, ReasonScheme},
		{"https://", strict, ReasonNoHost},
		{"https://user:pw@example.com/", strict, ReasonUserinfo},
		{"https://localhost/", strict, ReasonLocalhost},
		{"https://LOCALHOST./", strict, ReasonLocalhost},
		{"https://app.localhost/", strict, ReasonLocalhost},
		{"http://localhost:8080/", insecure, ""},
		{"https://127.0.0.1/", strict, ReasonLoopback},
		{"http://127.0.0.1:9000/", insecure, ""},
		{"https://[::1]/", strict, ReasonLoopback},
		{"https://[::ffff:127.0.0.1]/", strict, ReasonMapped},
		{"https://[::ffff:127.0.0.1]/", insecure, ReasonMapped},
		{"https://10.0.0.1/", insecure, ReasonPrivate},
		{"https://192.168.1.1/", strict, ReasonPrivate},
		{"https://172.16.0.1/", strict, ReasonPrivate},
		{"https://100.64.0.1/", strict, ReasonCGNAT},
		{"https://169.254.169.254/latest/meta-data", insecure, ReasonMetadata},
		{"https://[fd00:ec2::254]/", strict, ReasonMetadata},
		{"https://[64:ff9b::a00:1]/", strict, ReasonNAT64},
		{"https://0.0.0.0/", strict, ReasonUnspecified},
		{"https://%zz/", strict, ReasonURL},
		// Numeric forms a resolver or a receiver's URL parser reads as IPv4, refused whatever
		// they decode to.
		{"https://2130706433/", strict, ReasonNumeric + " of " + ReasonLoopback},
		{"https://0x7f.1/", strict, ReasonNumeric + " of " + ReasonLoopback},
		{"https://0X7F.0.0.1/", strict, ReasonNumeric + " of " + ReasonLoopback},
		{"https://127.1/", strict, ReasonNumeric + " of " + ReasonLoopback},
		{"http://127.1:9000/", insecure, ReasonNumeric},
		{"https://0/", strict, ReasonNumeric + " of " + ReasonUnspecified},
		{"https://0177.0.0.1/", strict, ReasonNumeric + " of " + ReasonLoopback},
		{"https://127.000.000.001/", strict, ReasonNumeric + " of " + ReasonLoopback},
		{"https://3627734734/", strict, ReasonNumeric}, // 216.58.214.206, public: still refused
		{"https://1.2.3.4.5/", strict, ReasonNumeric},
		{"https://99999999999/", strict, ReasonNumeric},
		{"https://a.0x/", strict, ReasonNumeric},
		{"https://1.2.3.4x/", strict, ""}, // a name: judged after resolution
		{"https://1e100.net/", strict, ""},
		// Names inside the network.
		{"https://metadata.google.internal/computeMetadata/v1/", strict, ReasonInternal},
		{"https://METADATA.GOOGLE.INTERNAL./", insecure, ReasonInternal},
		{"https://db.internal/", strict, ReasonInternal},
		{"https://metadata/", strict, ReasonInternal},
		{"http://receiver:8080/", insecure, ReasonInternal},
		{"https://printer.local/", strict, ReasonInternal},
		{"https://nas.home.arpa/", strict, ReasonInternal},
		{"https://host.localdomain/", strict, ReasonInternal},
		{"https://internal.example.com/", strict, ""},
		// IPv6 ranges that embed or tunnel to addresses no check can see.
		{"https://[::7f00:1]/", strict, ReasonCompat},
		{"https://[::ffff:0:0]/", strict, ReasonMapped},
		{"https://[fec0::1]/", strict, ReasonSiteLocal},
		{"https://[2001::1]/", strict, ReasonTeredo},
		{"https://[100::1]/", strict, ReasonDiscard},
		// Ports.
		{"https://example.com:22/", strict, ReasonPort},
		{"https://example.com:6379/", strict, ReasonPort},
		{"https://example.com:80/", strict, ReasonPort},
		{"https://example.com:6379/", anyPort, ""},
		{"https://example.com:9443/", URLPolicy{Ports: []uint16{9443}}, ""},
		{"https://example.com/", URLPolicy{Ports: []uint16{9443}}, ReasonPort},
		{"http://127.0.0.1:9000/", insecure, ""},
	}
	for _, tc := range tests {
		err := CheckURL(tc.url, tc.p)
		if tc.want == "" {
			if err != nil {
				t.Errorf("CheckURL(%q, %+v) = %v, want nil", tc.url, tc.p, err)
			}
			continue
		}
		b, ok := IsBlocked(err)
		if !ok || !strings.HasPrefix(b.Reason, tc.want) {
			t.Errorf("CheckURL(%q, %+v) = %v, want reason %q", tc.url, tc.p, err, tc.want)
		}
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// serve starts an HTTP server on a counting listener of network/addr; ok is false when the
// machine has no such address (no IPv6 loopback).
func serve(t testing.TB, network, addr string, h http.Handler) (*countingListener, bool) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, false
	}
	cl := &countingListener{Listener: ln}
	srv := &http.Server{Handler: h}
	go srv.Serve(cl) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return cl, true
}

func port(l net.Listener) uint16 { return netip.MustParseAddrPort(l.Addr().String()).Port() }

// fakeResolver maps names to addresses, as a DNS server under an attacker's control could.
type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

var hit = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })

// Every forbidden destination is refused with its reason, and none of the listeners standing
// behind them receives a connection.
func TestClientRefusesInternalDestinations(t *testing.T) {
	t.Parallel()
	internal, _ := serve(t, "tcp4", "127.0.0.1:0", hit)
	p4 := port(internal)
	internal6, has6 := serve(t, "tcp6", "[::1]:0", hit)
	public, _ := serve(t, "tcp4", "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, fmt.Sprintf("http://127.0.0.1:%d/", p4), http.StatusFound)
	}))
	pubAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port(public))
	loop := netip.MustParseAddr("127.0.0.1")
	p := Policy{
		AllowHTTP: true,
		Resolver: fakeResolver{
			"localhost":                 {loop, netip.MustParseAddr("::1")},
			"internal.example":          {loop},
			"rebind.example":            {netip.MustParseAddr("93.184.216.34"), loop},
			"public.example":            {loop},
			"metadata.example":          {netip.MustParseAddr("169.254.169.254")},
			"metadata.google.internal.": {netip.MustParseAddr("169.254.169.254")},
			"metadata":                  {netip.MustParseAddr("169.254.169.254")},
			"2130706433":                {loop},
			"127.1":                     {loop},
			"teredo.example":            {netip.MustParseAddr("2001::1")},
		},
		allow: func(ap netip.AddrPort) bool { return ap == pubAddr },
	}
	c := NewClient(p)
	tests := []struct {
		url, reason string
	}{
		{fmt.Sprintf("http://127.0.0.1:%d/", p4), ReasonLoopback},
		{fmt.Sprintf("http://localhost:%d/", p4), ReasonLocalhost},
		{fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/", p4), ReasonMapped},
		{fmt.Sprintf("http://internal.example:%d/", p4), ReasonLoopback},
		{fmt.Sprintf("http://rebind.example:%d/", p4), ReasonLoopback},
		{"http://10.0.0.1/", ReasonPrivate},
		{"http://192.168.1.1/", ReasonPrivate},
		{"http://172.16.0.1/", ReasonPrivate},
		{"http://100.64.0.1/", ReasonCGNAT},
		{"http://169.254.169.254/latest/meta-data/", ReasonMetadata},
		{"http://metadata.example/", ReasonMetadata},
		{"http://metadata.google.internal./", ReasonInternal},
		{"http://metadata/", ReasonInternal},
		{fmt.Sprintf("http://2130706433:%d/", p4), ReasonNumeric},
		{fmt.Sprintf("http://127.1:%d/", p4), ReasonNumeric},
		{fmt.Sprintf("http://0x7f.1:%d/", p4), ReasonNumeric},
		{"http://[::7f00:1]/", ReasonCompat},
		{"http://[fec0::1]/", ReasonSiteLocal},
		{"http://[2001::1]/", ReasonTeredo},
		{"http://teredo.example/", ReasonTeredo},
		{"http://[100::1]/", ReasonDiscard},
		{"http://[fd00:ec2::254]/", ReasonMetadata},
		{"http://[64:ff9b::7f00:1]/", ReasonNAT64},
		{"http://0.0.0.0/", ReasonUnspecified},
		{fmt.Sprintf("http://public.example:%d/", port(public)), ReasonRedirect},
	}
	if has6 {
		tests = append(tests, struct{ url, reason string }{fmt.Sprintf("http://[::1]:%d/", port(internal6)), ReasonLoopback})
	} else {
		tests = append(tests, struct{ url, reason string }{"http://[::1]:9/", ReasonLoopback})
	}
	for _, tc := range tests { //nolint:paralleltest // the checks after the loop count the connections every case made
		t.Run(tc.url, func(t *testing.T) {
			resp, err := c.Post(tc.url, "application/json", strings.NewReader("{}"))
			if err == nil {
				err = CheckResponse(resp)
				resp.Body.Close()
			}
			b, ok := IsBlocked(err)
			if !ok {
				t.Fatalf("not refused: %v", err)
			}
			if !strings.HasPrefix(b.Reason, tc.reason) {
				t.Fatalf("reason %q, want %q", b.Reason, tc.reason)
			}
			t.Logf("refused: %v", b)
		})
	}
	if n := internal.accepted.Load(); n != 0 {
		t.Errorf("internal listener accepted %d connections", n)
	}
	if has6 {
		if n := internal6.accepted.Load(); n != 0 {
			t.Errorf("internal IPv6 listener accepted %d connections", n)
		}
	}
	if n := public.accepted.Load(); n != 1 {
		t.Errorf("the public receiver accepted %d connections, want 1 (the redirecting answer)", n)
	}
}

// With proxy variables pointing at a listener, a request neither goes to the proxy nor gets
// past the dialer's check; an allowed destination is reached directly.
func TestClientIgnoresProxyVariables(t *testing.T) {
	proxy, _ := serve(t, "tcp4", "127.0.0.1:0", hit)
	proxyURL := "http://" + proxy.Addr().String()
	for _, v := range []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY"} {
		t.Setenv(v, proxyURL)
	}
	t.Setenv("NO_PROXY", "")
	t.Setenv("no_proxy", "")
	public, _ := serve(t, "tcp4", "127.0.0.1:0", hit)
	pubAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port(public))
	loop := netip.MustParseAddr("127.0.0.1")
	c := NewClient(Policy{
		AllowHTTP: true,
		Resolver:  fakeResolver{"internal.example": {loop}, "public.example": {loop}},
		allow:     func(ap netip.AddrPort) bool { return ap == pubAddr },
	})
	for _, u := range []string{"https://internal.example/", "http://internal.example/"} {
		_, err := c.Get(u)
		b, ok := IsBlocked(err)
		if !ok || b.Reason != ReasonLoopback {
			t.Errorf("GET %s = %v, want refused as loopback", u, err)
		}
	}
	resp, err := c.Get(fmt.Sprintf("http://public.example:%d/", pubAddr.Port()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if n := proxy.accepted.Load(); n != 0 {
		t.Errorf("the proxy accepted %d connections", n)
	}
	if n := public.accepted.Load(); n != 1 {
		t.Errorf("the public receiver accepted %d connections, want 1", n)
	}
}

func TestClientPolicy(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 4*MaxResponseBytes)
	srv, _ := serve(t, "tcp4", "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, big) //nolint:errcheck // the client stops reading
	}))
	u := fmt.Sprintf("http://127.0.0.1:%d/", port(srv))

	t.Run("loopback allowed explicitly, body capped", func(t *testing.T) {
		t.Parallel()
		resp, err := NewClient(Policy{AllowHTTP: true, AllowLoopback: true}).Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != MaxResponseBytes {
			t.Fatalf("read %d bytes, want the cap %d", len(b), MaxResponseBytes)
		}
	})
	t.Run("response headers capped", func(t *testing.T) {
		t.Parallel()
		huge, _ := serve(t, "tcp4", "127.0.0.1:0", hugeHeaders(1<<20))
		resp, err := NewClient(Policy{AllowHTTP: true, AllowLoopback: true}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port(huge)))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("a 1 MiB header block was read (status %d), want a failure past %d bytes", resp.StatusCode, MaxResponseHeaderBytes)
		}
		if !strings.Contains(err.Error(), "headers exceeded") {
			t.Fatalf("err = %v, want net/http's header limit", err)
		}
		small, _ := serve(t, "tcp4", "127.0.0.1:0", hugeHeaders(MaxResponseHeaderBytes/2))
		resp, err = NewClient(Policy{AllowHTTP: true, AllowLoopback: true}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port(small)))
		if err != nil {
			t.Fatalf("headers under the cap: %v", err)
		}
		resp.Body.Close()
	})
	t.Run("http refused without AllowHTTP", func(t *testing.T) {
		t.Parallel()
		own, _ := serve(t, "tcp4", "127.0.0.1:0", hit) // its own: the other cases reach srv meanwhile
		_, err := NewClient(Policy{AllowLoopback: true}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port(own)))
		if b, ok := IsBlocked(err); !ok || !strings.HasPrefix(b.Reason, ReasonScheme) {
			t.Fatalf("err = %v, want scheme refusal", err)
		}
		if own.accepted.Load() != 0 {
			t.Fatal("the server was reached")
		}
	})
	t.Run("userinfo refused", func(t *testing.T) {
		t.Parallel()
		_, err := NewClient(Policy{AllowHTTP: true, AllowLoopback: true}).Get(strings.Replace(u, "http://", "http://u:p@", 1))
		if b, ok := IsBlocked(err); !ok || b.Reason != ReasonUserinfo {
			t.Fatalf("err = %v, want userinfo refusal", err)
		}
	})
	t.Run("dns failure is not a refusal", func(t *testing.T) {
		t.Parallel()
		_, err := NewClient(Policy{Resolver: fakeResolver{}}).Get("https://nowhere.example/")
		if _, ok := IsBlocked(err); ok || err == nil {
			t.Fatalf("err = %v, want a plain resolution error", err)
		}
		var dnsErr *net.DNSError
		if !errors.As(err, &dnsErr) {
			t.Fatalf("err = %v, want a *net.DNSError inside", err)
		}
	})
}

// hugeHeaders answers 200 with about n bytes of response headers, in 4 KiB values.
func hugeHeaders(n int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		v := strings.Repeat("h", 4<<10)
		for i := range n / len(v) {
			w.Header().Set(fmt.Sprintf("X-Pad-%d", i), v)
		}
		w.WriteHeader(http.StatusOK)
	})
}

// The dialer's Control hook is the last line: it refuses an address that reaches the dialer
// without going through dial's check.
func TestControlHookRefuses(t *testing.T) {
	t.Parallel()
	ln, _ := serve(t, "tcp4", "127.0.0.1:0", hit)
	conn, err := newDialer(Policy{}).DialContext(context.Background(), "tcp", ln.Addr().String())
	if err == nil {
		conn.Close()
		t.Fatal("dialed a loopback address")
	}
	if b, ok := IsBlocked(err); !ok || b.Reason != ReasonLoopback {
		t.Fatalf("err = %v", err)
	}
	conn, err = newDialer(Policy{AllowLoopback: true}).DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("loopback allowed explicitly: %v", err)
	}
	conn.Close()
}

// BenchmarkHugeResponseHeaders measures what one delivery to a receiver answering with 1 MiB of
// headers costs the client (B/op): bounded by MaxResponseHeaderBytes, not by the receiver.
func BenchmarkHugeResponseHeaders(b *testing.B) {
	srv, _ := serve(b, "tcp4", "127.0.0.1:0", hugeHeaders(1<<20))
	u := fmt.Sprintf("http://127.0.0.1:%d/", port(srv))
	c := NewClient(Policy{AllowHTTP: true, AllowLoopback: true})
	b.ReportAllocs()
	for b.Loop() {
		if resp, err := c.Get(u); err == nil {
			resp.Body.Close()
			b.Fatal("the header block was read")
		}
	}
}

// A redirect is refused naming its target even when its Location does not parse: http.Client
// would fail such an answer as a transport error (retried for a day) before CheckRedirect runs.
func TestUnparseableRedirectIsRefused(t *testing.T) {
	t.Parallel()
	const location = "<!channel> <https://evil|Approve>"
	srv, _ := serve(t, "tcp4", "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Location", location)
		w.WriteHeader(http.StatusFound)
	}))
	resp, err := NewClient(Policy{AllowHTTP: true, AllowLoopback: true}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port(srv)))
	if err != nil {
		t.Fatalf("the answer failed as %v, want it returned for CheckResponse", err)
	}
	resp.Body.Close()
	b, ok := IsBlocked(CheckResponse(resp))
	if !ok || !strings.HasPrefix(b.Reason, ReasonRedirect) || !strings.Contains(b.Reason, location) {
		t.Fatalf("CheckResponse = %v, want a redirect refusal quoting %q", b, location)
	}
}
