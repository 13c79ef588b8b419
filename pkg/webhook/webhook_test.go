package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

func newSecret(t testing.TB) string {
	t.Helper()
	s, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSecret(t *testing.T) {
	t.Parallel()
	a, b := newSecret(t), newSecret(t)
	if a == b {
		t.Fatal("two secrets are equal")
	}
	if !strings.HasPrefix(a, webhook.SecretPrefix) {
		t.Fatalf("secret %q lacks the whsec_ prefix", a)
	}
	key, err := webhook.ParseSecret(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(key) < 24 || len(key) > 64 {
		t.Fatalf("key of %d bytes", len(key))
	}
	if _, err := standardwebhooks.NewWebhook(a); err != nil {
		t.Fatalf("official library refuses our secret: %v", err)
	}
}

func TestParseSecretInvalid(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "whsec_", "whsec_!!notbase64", "whsec_abc"} {
		if _, err := webhook.ParseSecret(s); !errors.Is(err, webhook.ErrInvalidSecret) {
			t.Errorf("ParseSecret(%q) = %v, want ErrInvalidSecret", s, err)
		}
	}
	if _, err := webhook.NewSigner(); !errors.Is(err, webhook.ErrInvalidSecret) {
		t.Errorf("NewSigner() with no secret = %v", err)
	}
}

// Ours signs, theirs verifies; theirs signs, ours verifies — over real HTTP headers.
func TestInteropWithOfficialLibrary(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	theirs, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := webhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := webhook.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"task.succeeded","timestamp":"2026-12-02T15:00:00Z","data":{"task_id":"t1"}}`)
	id, now := "t1.task.succeeded.0", time.Now()

	h := http.Header{}
	signer.SetHeaders(h, id, now, body)
	if err := theirs.Verify(body, h); err != nil {
		t.Fatalf("official library refuses our signature: %v", err)
	}

	sig, err := theirs.Sign(id, now, body)
	if err != nil {
		t.Fatal(err)
	}
	h2 := http.Header{}
	h2.Set(webhook.HeaderID, id)
	h2.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h2.Set(webhook.HeaderSignature, sig)
	if err := ours.Verify(body, h2); err != nil {
		t.Fatalf("we refuse the official library's signature: %v", err)
	}
	if got := signer.Signature(id, now, body); got != sig {
		t.Fatalf("signatures differ:\n ours   %s\n theirs %s", got, sig)
	}
}

func TestVerifyFailures(t *testing.T) {
	t.Parallel()
	secret, other := newSecret(t), newSecret(t)
	signer, err := webhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"task.failed"}`)
	now := time.Now()
	tests := []struct {
		name    string
		secret  string
		ts      time.Time
		body    []byte
		mutate  func(h http.Header)
		wantErr error
	}{
		{name: "tampered body", secret: secret, ts: now, body: []byte(`{"type":"task.succeeded"}`), wantErr: webhook.ErrNoMatchingSignature},
		{name: "wrong secret", secret: other, ts: now, body: body, wantErr: webhook.ErrNoMatchingSignature},
		{name: "too old", secret: secret, ts: now.Add(-6 * time.Minute), body: body, wantErr: webhook.ErrTimestampTooOld},
		{name: "too new", secret: secret, ts: now.Add(6 * time.Minute), body: body, wantErr: webhook.ErrTimestampTooNew},
		{name: "other id", secret: secret, ts: now, body: body, mutate: func(h http.Header) { h.Set(webhook.HeaderID, "x") }, wantErr: webhook.ErrNoMatchingSignature},
		{name: "missing signature", secret: secret, ts: now, body: body, mutate: func(h http.Header) { h.Del(webhook.HeaderSignature) }, wantErr: webhook.ErrMissingHeaders},
		{name: "bad timestamp", secret: secret, ts: now, body: body, mutate: func(h http.Header) { h.Set(webhook.HeaderTimestamp, "soon") }, wantErr: webhook.ErrInvalidHeaders},
		{name: "unknown version only", secret: secret, ts: now, body: body, mutate: func(h http.Header) {
			h.Set(webhook.HeaderSignature, strings.Replace(h.Get(webhook.HeaderSignature), "v1,", "v2,", 1))
		}, wantErr: webhook.ErrInvalidHeaders},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, err := webhook.NewVerifier(tc.secret)
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			signer.SetHeaders(h, "t1.task.failed.0", tc.ts, body)
			if tc.mutate != nil {
				tc.mutate(h)
			}
			if err := v.Verify(tc.body, h); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Verify = %v, want %v", err, tc.wantErr)
			}
			// The official library refuses the same delivery (when it was made with the right secret).
			if tc.secret == secret {
				if err := theirs.Verify(tc.body, h); err == nil {
					t.Fatal("official library accepts it")
				}
			}
		})
	}
}

func TestRotationSignsWithEverySecret(t *testing.T) {
	t.Parallel()
	old, next := newSecret(t), newSecret(t)
	signer, err := webhook.NewSigner(old, next)
	if err != nil {
		t.Fatal(err)
	}
	body, now := []byte(`{}`), time.Now()
	h := http.Header{}
	signer.SetHeaders(h, "id", now, body)
	if n := len(strings.Fields(h.Get(webhook.HeaderSignature))); n != 2 {
		t.Fatalf("%d signatures, want 2", n)
	}
	for _, s := range []string{old, next} {
		theirs, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := theirs.Verify(body, h); err != nil {
			t.Errorf("a receiver holding one secret refuses: %v", err)
		}
	}
	// A receiver that accepts several secrets verifies a delivery signed with only one of them.
	single, err := webhook.NewSigner(next)
	if err != nil {
		t.Fatal(err)
	}
	h1 := http.Header{}
	single.SetHeaders(h1, "id", now, body)
	v, err := webhook.NewVerifier(old, next)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(body, h1); err != nil {
		t.Fatal(err)
	}
}

func TestVerifierToleranceAndClock(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	signer, _ := webhook.NewSigner(secret)
	v, _ := webhook.NewVerifier(secret)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v.Now = func() time.Time { return at.Add(30 * time.Second) }
	v.Tolerance = 10 * time.Second
	h := http.Header{}
	signer.SetHeaders(h, "id", at, nil)
	if err := v.Verify(nil, h); !errors.Is(err, webhook.ErrTimestampTooOld) {
		t.Fatalf("Verify = %v, want too old", err)
	}
	v.Tolerance = time.Minute
	if err := v.Verify(nil, h); err != nil {
		t.Fatal(err)
	}
}

func TestReceiver(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	v, _ := webhook.NewVerifier(secret)
	var out testenv.LogBuffer
	srv := httptest.NewServer(webhook.Receiver(v, &out))
	defer srv.Close()
	body := []byte(`{"type":"task.succeeded","data":{}}`)

	post := func(sign func(h http.Header)) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		sign(req.Header)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	theirs, _ := standardwebhooks.NewWebhook(secret)
	for range 2 {
		if code := post(func(h http.Header) {
			sig, _ := theirs.Sign("good", time.Now(), body)
			h.Set(webhook.HeaderID, "good")
			h.Set(webhook.HeaderTimestamp, strconv.FormatInt(time.Now().Unix(), 10))
			h.Set(webhook.HeaderSignature, sig)
		}); code != http.StatusNoContent {
			t.Fatalf("verified delivery answered %d", code)
		}
	}
	wrong, _ := webhook.NewSigner(newSecret(t))
	if code := post(func(h http.Header) { wrong.SetHeaders(h, "bad", time.Now(), body) }); code != http.StatusUnauthorized {
		t.Fatalf("forged delivery answered %d", code)
	}
	got := out.String()
	if !strings.Contains(got, "verified webhook-id=good type=task.succeeded") || !strings.Contains(got, string(body)) {
		t.Errorf("output lacks the verified delivery:\n%s", got)
	}
	if !strings.Contains(got, "webhook-id=good type=task.succeeded timestamp=") || !strings.Contains(got, " duplicate=2\n") {
		t.Errorf("output does not flag the second delivery of the same id:\n%s", got)
	}
	if !strings.Contains(got, `REJECTED webhook-id="bad"`) {
		t.Errorf("output lacks the rejection:\n%s", got)
	}
}

func TestListenAndPrint(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- webhook.ListenAndPrint(ctx, "127.0.0.1:0", secret, pw); pw.Close() }()

	buf := make([]byte, 256)
	n, err := pr.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	first := string(buf[:n])
	addr, ok := strings.CutPrefix(strings.TrimSpace(first), "listening on ")
	if !ok {
		t.Fatalf("first line %q", first)
	}
	signer, _ := webhook.NewSigner(secret)
	body := []byte(`{"type":"task.dead"}`)
	req, _ := http.NewRequest(http.MethodPost, addr, bytes.NewReader(body))
	signer.SetHeaders(req.Header, "t.task.dead.0", time.Now(), body)
	respc := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			respc <- 0
			return
		}
		resp.Body.Close()
		respc <- resp.StatusCode
	}()
	n, err = pr.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:n]); !strings.Contains(got, "verified webhook-id=t.task.dead.0") {
		t.Fatalf("printed %q", got)
	}
	go io.Copy(io.Discard, pr) //nolint:errcheck // drain the body line
	if code := <-respc; code != http.StatusNoContent {
		t.Fatalf("status %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
