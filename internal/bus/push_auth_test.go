package bus_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/api/idtoken"
	"google.golang.org/api/option"

	"github.com/genbox-dev/genbox/internal/bus"
)

const (
	testAudience = "genbox-dlqnotifier-push-test"
	testPusher   = "genbox-push@test-project.iam.gserviceaccount.com"
	testKeyID    = "test-key-1"
)

// googleCerts serves a JWKS for keys at the path idtoken fetches Google's certificates from.
type googleCerts struct {
	srv     *httptest.Server
	fetches atomic.Int64
}

func newGoogleCerts(tb testing.TB, keys map[string]*rsa.PublicKey) *googleCerts {
	tb.Helper()
	g := &googleCerts{}
	type jwk struct {
		Kty string `json:"kty"`
		Alg string `json:"alg"`
		Use string `json:"use"`
		Kid string `json:"kid"`
		N   string `json:"n"`
		E   string `json:"e"`
	}
	var set struct {
		Keys []jwk `json:"keys"`
	}
	for kid, k := range keys {
		set.Keys = append(set.Keys, jwk{Kty: "RSA", Alg: "RS256", Use: "sig", Kid: kid,
			N: base64.RawURLEncoding.EncodeToString(k.N.Bytes()),
			E: base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.E)).Bytes())})
	}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/oauth2/v3/certs" {
			http.NotFound(w, r)
			return
		}
		g.fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(set)
	}))
	tb.Cleanup(g.srv.Close)
	return g
}

// validator is a real idtoken.Validator whose requests to www.googleapis.com go to g; any other
// host is an error, so a validation that needed the network fails.
func (g *googleCerts) validator(t testing.TB) *idtoken.Validator {
	t.Helper()
	target, err := url.Parse(g.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host != "www.googleapis.com" {
			return nil, errors.New("unexpected request to " + r.URL.String())
		}
		r = r.Clone(r.Context())
		r.URL.Scheme, r.URL.Host, r.Host = target.Scheme, target.Host, ""
		return g.srv.Client().Transport.RoundTrip(r)
	})}
	v, err := idtoken.NewValidator(context.Background(), option.WithHTTPClient(client))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// signIDToken returns an RS256 JWT shaped like a Pub/Sub push token.
func signIDToken(t testing.TB, key *rsa.PrivateKey, kid string, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signed := enc(map[string]string{"alg": "RS256", "kid": kid, "typ": "JWT"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func pushClaims(now time.Time) map[string]any {
	return map[string]any{
		"iss": "https://accounts.google.com", "aud": testAudience, "azp": "1234567890",
		"sub": "1234567890", "email": testPusher, "email_verified": true,
		"iat": now.Add(-time.Minute).Unix(), "exp": now.Add(time.Hour).Unix(),
	}
}

func TestVerifyPush(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	certs := newGoogleCerts(t, map[string]*rsa.PublicKey{testKeyID: &key.PublicKey})
	v := certs.validator(t)
	now := time.Now()
	token := func(k *rsa.PrivateKey, change func(c map[string]any)) string {
		c := pushClaims(now)
		if change != nil {
			change(c)
		}
		return signIDToken(t, k, testKeyID, c)
	}
	valid := token(key, nil)
	parts := strings.Split(valid, ".")
	tampered := pushClaims(now)
	tampered["email"] = "attacker@example.com"
	tamperedPayload, _ := json.Marshal(tampered)

	tests := []struct {
		name          string
		authorization string
		want          int
	}{
		{"valid", "Bearer " + valid, http.StatusNoContent},
		{"lower-case scheme", "bearer " + valid, http.StatusNoContent},
		{"missing header", "", http.StatusUnauthorized},
		{"not Bearer", "Basic " + valid, http.StatusUnauthorized},
		{"empty token", "Bearer ", http.StatusUnauthorized},
		{"malformed", "Bearer not-a-jwt", http.StatusUnauthorized},
		{"garbage segments", "Bearer a.b.c", http.StatusUnauthorized},
		{"wrong audience", "Bearer " + token(key, func(c map[string]any) { c["aud"] = "genbox-resulthandler-push-test" }), http.StatusUnauthorized},
		{"wrong email", "Bearer " + token(key, func(c map[string]any) { c["email"] = "someone@test-project.iam.gserviceaccount.com" }), http.StatusUnauthorized},
		{"no email", "Bearer " + token(key, func(c map[string]any) { delete(c, "email") }), http.StatusUnauthorized},
		{"email_verified false", "Bearer " + token(key, func(c map[string]any) { c["email_verified"] = false }), http.StatusUnauthorized},
		{"email_verified missing", "Bearer " + token(key, func(c map[string]any) { delete(c, "email_verified") }), http.StatusUnauthorized},
		{"email_verified a string", "Bearer " + token(key, func(c map[string]any) { c["email_verified"] = "true" }), http.StatusUnauthorized},
		{"not Google's issuer", "Bearer " + token(key, func(c map[string]any) { c["iss"] = "https://evil.example.com" }), http.StatusUnauthorized},
		{"expired", "Bearer " + token(key, func(c map[string]any) {
			c["iat"], c["exp"] = now.Add(-2*time.Hour).Unix(), now.Add(-time.Hour).Unix()
		}), http.StatusUnauthorized},
		{"signed by another key", "Bearer " + token(other, nil), http.StatusUnauthorized},
		{"unknown key id", "Bearer " + signIDToken(t, key, "no-such-key", pushClaims(now)), http.StatusUnauthorized},
		{"claims changed after signing", "Bearer " + parts[0] + "." + base64.RawURLEncoding.EncodeToString(tamperedPayload) + "." + parts[2], http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var called atomic.Bool
			next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				called.Store(true)
				w.WriteHeader(http.StatusNoContent)
			})
			h := bus.VerifyPush(next, bus.PushAuth{Audience: testAudience, ServiceAccount: testPusher, Validator: v}, slog.New(slog.DiscardHandler))
			req := httptest.NewRequest(http.MethodPost, "/pubsub/push", strings.NewReader(`{}`))
			if tc.authorization != "" {
				req.Header.Set("Authorization", tc.authorization)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.want, rec.Body)
			}
			if ok := tc.want == http.StatusNoContent; called.Load() != ok {
				t.Fatalf("handler called %v, want %v", called.Load(), ok)
			}
			if tc.want == http.StatusUnauthorized {
				if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
					t.Fatalf("Content-Type %q", ct)
				}
				if rec.Header().Get("WWW-Authenticate") == "" {
					t.Fatal("no WWW-Authenticate")
				}
			}
		})
	}
	t.Cleanup(func() {
		if certs.fetches.Load() == 0 {
			t.Error("the validator never fetched the signing keys")
		}
	})
}

// Without an audience or a service account, VerifyPush refuses everything, even a token that is
// otherwise valid.
func TestVerifyPushFailsClosed(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	v := newGoogleCerts(t, map[string]*rsa.PublicKey{testKeyID: &key.PublicKey}).validator(t)
	valid := "Bearer " + signIDToken(t, key, testKeyID, pushClaims(time.Now()))
	for _, a := range []bus.PushAuth{
		{ServiceAccount: testPusher, Validator: v},
		{Audience: testAudience, Validator: v},
	} {
		if a.Enabled() {
			t.Fatalf("%+v enabled", a)
		}
		var called atomic.Bool
		h := bus.VerifyPush(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) }), a, slog.New(slog.DiscardHandler))
		req := httptest.NewRequest(http.MethodPost, "/pubsub/push", nil)
		req.Header.Set("Authorization", valid)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || called.Load() {
			t.Fatalf("%+v: status %d, called %v", a, rec.Code, called.Load())
		}
	}
}

// No Authorization header that is not a token signed by the push key is admitted, and none
// panics: the fuzzer mutates real tokens (re-signing is beyond it).
func FuzzVerifyPush(f *testing.F) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	v := newGoogleCerts(f, map[string]*rsa.PublicKey{testKeyID: &key.PublicKey}).validator(f)
	now := time.Now()
	expired := pushClaims(now)
	expired["exp"] = now.Add(-time.Hour).Unix()
	wrongAud := pushClaims(now)
	wrongAud["aud"] = "other"
	for _, seed := range []string{
		"", "Bearer", "Bearer ", "Bearer a.b.c", "Bearer ...", "bearer x",
		"Bearer " + signIDToken(f, key, testKeyID, expired),
		"Bearer " + signIDToken(f, key, testKeyID, wrongAud),
		"Bearer " + signIDToken(f, key, "other-kid", pushClaims(now)),
	} {
		f.Add(seed)
	}
	var called atomic.Bool
	h := bus.VerifyPush(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) }),
		bus.PushAuth{Audience: testAudience, ServiceAccount: testPusher, Validator: v}, slog.New(slog.DiscardHandler))
	f.Fuzz(func(t *testing.T, authorization string) {
		called.Store(false)
		req := httptest.NewRequest(http.MethodPost, "/pubsub/push", nil)
		req.Header["Authorization"] = []string{authorization}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || called.Load() {
			t.Fatalf("%q admitted: status %d", authorization, rec.Code)
		}
	})
}
