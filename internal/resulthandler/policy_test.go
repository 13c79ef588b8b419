package resulthandler

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/testenv"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status     int
		header     http.Header
		want       outcomeKind
		retryAfter time.Duration
	}{
		{200, nil, delivered, 0},
		{202, nil, delivered, 0},
		{204, nil, delivered, 0},
		{408, nil, retry, 0},
		{429, http.Header{"Retry-After": {"120"}}, retry, 2 * time.Minute},
		{429, http.Header{"Retry-After": {"Wed, 21 Oct 2015 07:28:00 GMT"}}, retry, 0},
		{500, nil, retry, 0},
		{502, nil, retry, 0},
		{503, http.Header{"Retry-After": {"5"}}, retry, 5 * time.Second},
		{301, http.Header{"Location": {"http://10.0.0.1/"}}, dead, 0},
		{307, nil, dead, 0},
		{400, nil, dead, 0},
		{401, nil, dead, 0},
		{403, nil, dead, 0},
		{404, nil, dead, 0},
		{410, nil, dead, 0},
		{422, nil, dead, 0},
	}
	for _, tc := range tests {
		req := &http.Request{URL: &url.URL{Scheme: "https", Host: "example.com", Path: "/hook"}}
		h := tc.header
		if h == nil {
			h = http.Header{}
		}
		o := classify(&http.Response{StatusCode: tc.status, Header: h, Request: req})
		if o.kind != tc.want || o.retryAfter != tc.retryAfter || o.status != tc.status {
			t.Errorf("classify(%d) = %+v, want %v after %v", tc.status, o, tc.want, tc.retryAfter)
		}
		if o.kind == dead && o.err == "" {
			t.Errorf("classify(%d): dead without a reason", tc.status)
		}
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	p := testPolicy("x") // 1s .. 10s
	h := &Handler{policy: p, Rand: func() float64 { return 1 }}
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 64: 10 * time.Second, 1000: 10 * time.Second} {
		if got := h.backoff(n, 0); got != want {
			t.Errorf("backoff(%d) at the ceiling = %v, want %v", n, got, want)
		}
	}
	h.Rand = func() float64 { return 0 }
	if got := h.backoff(5, 0); got != p.BackoffMin {
		t.Errorf("backoff with zero jitter = %v, want the floor %v", got, p.BackoffMin)
	}
	if got := h.backoff(1, 5*time.Second); got != 5*time.Second {
		t.Errorf("Retry-After 5s: %v", got)
	}
	if got := h.backoff(1, time.Hour); got != p.BackoffMax {
		t.Errorf("Retry-After 1h: %v, want capped at %v", got, p.BackoffMax)
	}
	// The real jitter stays within [min, ceiling].
	h2, err := New(nil, nil, nil, nil, nil, p)
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		if d := h2.backoff(3, 0); d < time.Second || d > 4*time.Second {
			t.Fatalf("backoff(3) = %v outside [1s, 4s]", d)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) (func(string) string, map[string]bool) {
		asked := map[string]bool{}
		return func(k string) string { asked[k] = true; return kv[k] }, asked
	}
	getenv, asked := env(map[string]string{EnvProject: "p", EnvInstance: "i-1", EnvSecretsKey: testenv.SecretsKey, EnvUnauthPush: "1"})
	c, err := FromEnv(getenv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Consumer != ConsumerPush || c.Port != 8080 || c.Timeout != 10*time.Second || c.Horizon != 24*time.Hour ||
		c.Owner != "i-1" || c.LeaseTTL() != 30*time.Second || c.AllowInsecure || c.Subscription == "" {
		t.Fatalf("defaults %+v", c)
	}
	if c.PushAuth().Enabled() || !c.UnauthenticatedPush {
		t.Fatalf("push auth %+v, unauthenticated push %v; want off by the local-use setting", c.PushAuth(), c.UnauthenticatedPush)
	}
	for _, v := range []string{EnvProject, EnvPort, EnvInstance, EnvSubscription, EnvConsumer, EnvConcurrency, EnvTimeout,
		EnvHorizon, EnvBackoffMin, EnvBackoffMax, EnvNoticeGrace, EnvAllowInsecure, EnvShutdownGrace, EnvPushAudience, EnvPushAccount, EnvUnauthPush, EnvSecretsKey} {
		if !asked[v] {
			t.Errorf("FromEnv did not ask for %s", v)
		}
	}
	getenv, _ = env(map[string]string{EnvProject: "p", EnvSecretsKey: "projects/p/locations/global/keyRings/r/cryptoKeys/k", EnvConsumer: "pull", EnvTimeout: "3s", EnvHorizon: "1h",
		EnvAllowInsecure: "true", EnvBackoffMin: "2s", EnvBackoffMax: "1m", EnvPushAudience: "aud", EnvPushAccount: "push@p.iam.gserviceaccount.com"})
	c, err = FromEnv(getenv)
	if err != nil {
		t.Fatal(err)
	}
	if a := c.PushAuth(); !a.Enabled() || a.Audience != "aud" || a.ServiceAccount != "push@p.iam.gserviceaccount.com" {
		t.Fatalf("push auth %+v", a)
	}
	if c.Consumer != ConsumerPull || c.LeaseTTL() != 9*time.Second || c.Horizon != time.Hour || !c.SSRF().AllowHTTP || !c.SSRF().AllowLoopback {
		t.Fatalf("parsed %+v", c)
	}
	for _, tc := range []struct {
		kv   map[string]string
		name string
	}{
		{map[string]string{}, EnvProject},
		{map[string]string{EnvProject: "p", EnvConsumer: "poll"}, EnvConsumer},
		{map[string]string{EnvProject: "p", EnvTimeout: "ten"}, EnvTimeout},
		{map[string]string{EnvProject: "p", EnvTimeout: "0s"}, EnvTimeout},
		{map[string]string{EnvProject: "p", EnvBackoffMin: "1m", EnvBackoffMax: "1s"}, EnvBackoffMax},
		{map[string]string{EnvProject: "p", EnvAllowInsecure: "maybe"}, EnvAllowInsecure},
		{map[string]string{EnvProject: "p", EnvPort: "http"}, EnvPort},
		{map[string]string{EnvProject: "p", EnvConcurrency: "0"}, EnvConcurrency},
		{map[string]string{EnvProject: "p", EnvPushAudience: "aud"}, EnvPushAccount},
		{map[string]string{EnvProject: "p", EnvPushAccount: "push@p.iam.gserviceaccount.com"}, EnvPushAudience},
		{map[string]string{EnvProject: "p"}, EnvSecretsKey},
		{map[string]string{EnvProject: "p", EnvSecretsKey: testenv.SecretsKey}, EnvPushAudience}, // push mode verifies pushes
		{map[string]string{EnvProject: "p", EnvSecretsKey: testenv.SecretsKey, EnvUnauthPush: "yes please"}, EnvUnauthPush},
		{map[string]string{EnvProject: "p", EnvSecretsKey: "whsec_not_a_key"}, EnvSecretsKey},
	} {
		getenv, _ := env(tc.kv)
		_, err := FromEnv(getenv)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%v: err %v, want one naming %s", tc.kv, err, tc.name)
		}
	}
}
