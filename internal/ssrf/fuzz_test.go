package ssrf

import (
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// FuzzCheckURL holds the submit-time check to what it promises: whatever it admits is an https
// URL without userinfo on an allowed port whose host is no forbidden literal, no numeric form, no
// internal name; the delivery-time host check agrees with it; and neither the case of the host
// nor a trailing dot turns a refusal into an admission.
func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{
		"https://example.com/hook", "https://example.com:8443/h?x=1", "https://93.184.216.34/",
		"https://2130706433/", "https://0x7f.1/", "https://127.1/", "https://0/", "https://0177.0.0.1/",
		"https://metadata.google.internal/", "https://metadata/", "https://localhost/",
		"https://[::7f00:1]/", "https://[::ffff:7f00:1]/", "https://[fec0::1]/", "https://[2001::1]/",
		"https://[100::1]/", "https://[fe80::1%25eth0]/", "https://%31%32%37.1/", "https://example.com:22/",
		"https://user@example.com/", "http://example.com/", "https://1.2.3.4x/", "https://EXAMPLE.com./",
	} {
		f.Add(s)
	}
	p := URLPolicy{Ports: DefaultPorts}
	f.Fuzz(func(t *testing.T, raw string) {
		err := CheckURL(raw, p)
		if err != nil {
			if _, ok := IsBlocked(err); !ok {
				t.Fatalf("CheckURL(%q) = %v, not a *BlockedError", raw, err)
			}
			u, perr := url.Parse(raw)
			if perr != nil || u.Host == "" {
				return
			}
			variant := *u
			variant.Host = strings.ToUpper(u.Hostname()) + "."
			if strings.Contains(u.Hostname(), ":") {
				variant.Host = "[" + strings.ToUpper(u.Hostname()) + "]"
			}
			if port := u.Port(); port != "" {
				variant.Host += ":" + port
			}
			if CheckURL(variant.String(), p) == nil {
				t.Fatalf("CheckURL refuses %q but admits %q", raw, variant.String())
			}
			return
		}
		u, perr := url.Parse(raw)
		if perr != nil {
			t.Fatalf("admitted %q, which does not parse: %v", raw, perr)
		}
		if u.Scheme != "https" || u.User != nil {
			t.Fatalf("admitted %q: scheme %q, userinfo %v", raw, u.Scheme, u.User)
		}
		host := u.Hostname()
		if a, err := netip.ParseAddr(host); err == nil {
			if r := Classify(a); r != "" {
				t.Fatalf("admitted %q: host %s is %s", raw, host, r)
			}
		} else {
			name := strings.TrimSuffix(strings.ToLower(host), ".")
			labels := strings.Split(name, ".")
			last := labels[len(labels)-1]
			if len(labels) < 2 || strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") && strings.Trim(last[2:], "0123456789abcdef") == "" {
				t.Fatalf("admitted %q: host %q is a numeric form or a single label", raw, host)
			}
			if last == "internal" || last == "local" || last == "localhost" || last == "localdomain" || strings.HasSuffix(name, ".home.arpa") {
				t.Fatalf("admitted %q: host %q is an internal name", raw, host)
			}
		}
		port := u.Port()
		if port == "" {
			port = "443"
		}
		if n, err := strconv.Atoi(port); err != nil || !slices.Contains(DefaultPorts, uint16(n)) {
			t.Fatalf("admitted %q: port %s", raw, port)
		}
		if err := CheckHost(host, false); err != nil {
			t.Fatalf("admitted %q at submission, but the delivery check refuses its host: %v", raw, err)
		}
	})
}
