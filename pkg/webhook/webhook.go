// Package webhook signs and verifies webhooks per the Standard Webhooks specification
// (https://www.standardwebhooks.com): genbox signs every delivery with it, and receivers use it
// to check that a delivery comes from genbox, is unaltered and is not a replay.
//
// A delivery carries three headers: webhook-id (stable across retries: dedupe on it),
// webhook-timestamp (Unix seconds) and webhook-signature, a space-separated list of "v1,<base64
// HMAC-SHA256 of id.timestamp.body>", one per active secret, so that a receiver holding either
// the old or the new secret verifies while a secret rotates. Secrets are "whsec_" followed by the
// base64 of the key.
//
// What Verifier.Verify checks: the three headers are present; the timestamp is within the
// tolerance (5 minutes either way by default) of the receiver's clock; one "v1" signature is the
// HMAC-SHA256, under one of the receiver's secrets, of exactly these id, timestamp and body bytes
// (compared in constant time). Guard.Check adds: the webhook-id has not been accepted before
// while its SeenStore remembers it — a captured request sent again within the tolerance is
// refused with ErrReplayed, and so is genbox's own retry of a delivery whose 2xx was lost.
//
// What neither checks: that the sender is genbox rather than anyone else holding the secret;
// that the body is well-formed JSON or an event of a task the receiver knows; the order in
// which events of different tasks arrive; the transport (use https); replays across receiver
// instances unless their SeenStore is shared, or of an id the store has forgotten (past its
// bound or its memory). Verify the raw body before decoding it: a re-encoded body does not match.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of the Standard Webhooks specification.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every secret.
const SecretPrefix = "whsec_"

// DefaultTolerance is how far a timestamp may be from the verifier's clock, either way.
const DefaultTolerance = 5 * time.Minute

// secretBytes is the key length NewSecret draws: within the 24..64 bytes the spec recommends.
const secretBytes = 32

// Sentinel errors. Verify wraps exactly one of them, so receivers can tell why with errors.Is.
var (
	ErrInvalidSecret       = errors.New("webhook: invalid secret")
	ErrMissingHeaders      = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	ErrInvalidHeaders      = errors.New("webhook: malformed signature headers")
	ErrTimestampTooOld     = errors.New("webhook: timestamp too old")
	ErrTimestampTooNew     = errors.New("webhook: timestamp too new")
	ErrNoMatchingSignature = errors.New("webhook: no matching signature")
)

// NewSecret returns a new random secret: "whsec_" and the base64 of 32 random bytes.
func NewSecret() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("webhook: new secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// ParseSecret returns the key of a secret. The "whsec_" prefix is optional, as in the official
// libraries; the rest must be non-empty standard base64.
func ParseSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSecret, err)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("%w: empty key", ErrInvalidSecret)
	}
	return key, nil
}

func parseSecrets(secrets []string) ([][]byte, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secret", ErrInvalidSecret)
	}
	keys := make([][]byte, len(secrets))
	for i, s := range secrets {
		k, err := ParseSecret(s)
		if err != nil {
			return nil, fmt.Errorf("secret %d: %w", i, err)
		}
		keys[i] = k
	}
	return keys, nil
}

// sign returns the base64 HMAC-SHA256 of "id.timestamp.body" under key.
func sign(key []byte, id string, ts int64, body []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write(strconv.AppendInt(nil, ts, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// Signer signs deliveries with every active secret of a tenant. It is safe for concurrent use.
type Signer struct {
	keys [][]byte
}

// NewSigner returns a Signer for one or more secrets (several while a secret rotates).
func NewSigner(secrets ...string) (*Signer, error) {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return nil, err
	}
	return &Signer{keys: keys}, nil
}

// Signature returns the webhook-signature value for a delivery: "v1,<sig>" per secret, separated
// by spaces.
func (s *Signer) Signature(id string, ts time.Time, body []byte) string {
	var b strings.Builder
	for i, k := range s.keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(sign(k, id, ts.Unix(), body))
	}
	return b.String()
}

// SetHeaders sets the three Standard Webhooks headers of a delivery on h.
func (s *Signer) SetHeaders(h http.Header, id string, ts time.Time, body []byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, s.Signature(id, ts, body))
}

// Verifier checks deliveries against one or more secrets. Its zero Tolerance means
// DefaultTolerance and a nil Now the wall clock. It is safe for concurrent use.
type Verifier struct {
	keys      [][]byte
	Tolerance time.Duration
	Now       func() time.Time
}

// NewVerifier returns a Verifier accepting a signature made with any of secrets.
func NewVerifier(secrets ...string) (*Verifier, error) {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return nil, err
	}
	return &Verifier{keys: keys}, nil
}

// Verify checks the headers of a delivery against its raw body: every header present, the
// timestamp within the tolerance, and at least one "v1" signature made with one of the secrets
// (compared in constant time). Unknown signature versions are skipped, as the spec requires.
func (v *Verifier) Verify(body []byte, h http.Header) error {
	id, tsRaw, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsRaw == "" || sigs == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(tsRaw, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q", ErrInvalidHeaders, tsRaw)
	}
	tol := v.tolerance()
	at := time.Unix(ts, 0)
	switch n := v.now(); {
	case n.Sub(at) > tol:
		return ErrTimestampTooOld
	case at.Sub(n) > tol:
		return ErrTimestampTooNew
	}
	candidates := parseSignatures(sigs)
	if len(candidates) == 0 {
		return fmt.Errorf("%w: no v1 signature", ErrInvalidHeaders)
	}
	for _, k := range v.keys {
		want := []byte(sign(k, id, ts, body))
		for _, c := range candidates {
			if hmac.Equal(want, []byte(c)) {
				return nil
			}
		}
	}
	return ErrNoMatchingSignature
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func (v *Verifier) tolerance() time.Duration {
	if v.Tolerance > 0 {
		return v.Tolerance
	}
	return DefaultTolerance
}

// parseSignatures returns the "v1" signatures of a webhook-signature header value, whose entries
// the spec delimits with single spaces.
func parseSignatures(header string) []string {
	var out []string
	for _, f := range strings.Split(header, " ") {
		version, sig, ok := strings.Cut(f, ",")
		if ok && version == "v1" && sig != "" {
			out = append(out, sig)
		}
	}
	return out
}
