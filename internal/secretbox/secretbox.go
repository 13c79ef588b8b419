// Package secretbox seals the tenants' webhook signing secrets that genbox keeps in Firestore,
// by envelope encryption: each secret is encrypted (AES-256-GCM) under a data key of its own,
// and that data key is stored wrapped by a key-encryption key that never leaves Cloud KMS — or,
// for local use, a key the process holds. Every service can read Firestore, so without this
// every service account could read every secret; with it, a secret is readable only by who may
// unwrap (the resulthandler, which signs), and written only by who may wrap (the publisher, which
// creates and rotates). Both bind a sealed secret to its tenant (authenticated data), so a sealed
// secret copied into another tenant's document does not open.
package secretbox

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Sealed is a secret as stored.
type Sealed struct {
	Key        string `firestore:"key"`         // the key-encryption key: a KMS CryptoKey name, or "local"
	WrappedKey []byte `firestore:"wrapped_key"` // the data key, wrapped by Key
	Nonce      []byte `firestore:"nonce"`
	Ciphertext []byte `firestore:"ciphertext"` // the secret, sealed by the data key
}

// Wrapper holds a key-encryption key: it wraps data keys and unwraps them. aad binds a wrapped
// key to what it protects; unwrapping with other aad fails.
type Wrapper interface {
	// Key names the key-encryption key, as Sealed.Key records it.
	Key() string
	Wrap(ctx context.Context, dek, aad []byte) ([]byte, error)
	Unwrap(ctx context.Context, wrapped, aad []byte) ([]byte, error)
}

// ErrOtherKey means a secret was sealed under another key-encryption key than the Box holds.
var ErrOtherKey = errors.New("secretbox: sealed under another key")

// Box seals and opens secrets with a Wrapper's key. Opened data keys are kept in memory for
// CacheTTL, so a service that opens the same secrets for every delivery asks KMS once per period,
// not per delivery. Safe for concurrent use.
type Box struct {
	w   Wrapper
	now func() time.Time

	mu    sync.Mutex
	cache map[[sha256.Size]byte]cachedKey // sha256(aad, wrapped key) → data key
}

type cachedKey struct {
	dek     []byte
	expires time.Time
}

// CacheTTL is how long an opened data key stays in memory.
const CacheTTL = 10 * time.Minute

// maxCached bounds the data keys kept: past it the cache starts over.
const maxCached = 10_000

// New returns a Box over w.
func New(w Wrapper) *Box {
	return &Box{w: w, now: time.Now, cache: map[[sha256.Size]byte]cachedKey{}}
}

// aad is the authenticated data of a secret of tenant.
func aad(tenant string) []byte { return []byte("genbox/webhook-secret/" + tenant) }

// Seal encrypts secret, one of tenant's, under a new data key wrapped by the Box's key.
func (b *Box) Seal(ctx context.Context, tenant, secret string) (Sealed, error) {
	dek := make([]byte, 32)
	if _, err := rand.Read(dek); err != nil {
		return Sealed{}, fmt.Errorf("secretbox: data key: %w", err)
	}
	gcm, err := newGCM(dek)
	if err != nil {
		return Sealed{}, err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return Sealed{}, fmt.Errorf("secretbox: nonce: %w", err)
	}
	wrapped, err := b.w.Wrap(ctx, dek, aad(tenant))
	if err != nil {
		return Sealed{}, fmt.Errorf("secretbox: wrap the data key of a secret of %s: %w", tenant, err)
	}
	return Sealed{Key: b.w.Key(), WrappedKey: wrapped, Nonce: nonce, Ciphertext: gcm.Seal(nil, nonce, []byte(secret), aad(tenant))}, nil
}

// Open decrypts s, a secret of tenant.
func (b *Box) Open(ctx context.Context, tenant string, s Sealed) (string, error) {
	if s.Key != b.w.Key() {
		return "", fmt.Errorf("%w: %q, this service holds %q", ErrOtherKey, s.Key, b.w.Key())
	}
	dek, err := b.dataKey(ctx, tenant, s.WrappedKey)
	if err != nil {
		return "", err
	}
	gcm, err := newGCM(dek)
	if err != nil {
		return "", err
	}
	plain, err := gcm.Open(nil, s.Nonce, s.Ciphertext, aad(tenant))
	if err != nil {
		return "", fmt.Errorf("secretbox: open a secret of %s: %w", tenant, err)
	}
	return string(plain), nil
}

// dataKey unwraps a data key of tenant, from memory when it was unwrapped within CacheTTL.
func (b *Box) dataKey(ctx context.Context, tenant string, wrapped []byte) ([]byte, error) {
	h := sha256.New()
	h.Write(aad(tenant))
	h.Write([]byte{0})
	h.Write(wrapped)
	var id [sha256.Size]byte
	h.Sum(id[:0])
	now := b.now()
	b.mu.Lock()
	c, ok := b.cache[id]
	b.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.dek, nil
	}
	dek, err := b.w.Unwrap(ctx, wrapped, aad(tenant))
	if err != nil {
		return nil, fmt.Errorf("secretbox: unwrap the data key of a secret of %s: %w", tenant, err)
	}
	b.mu.Lock()
	if len(b.cache) >= maxCached {
		clear(b.cache)
	}
	b.cache[id] = cachedKey{dek: dek, expires: now.Add(CacheTTL)}
	b.mu.Unlock()
	return dek, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secretbox: %w", err)
	}
	return cipher.NewGCM(block)
}

// LocalPrefix starts a local key: "local:" and the standard base64 of 32 bytes.
const LocalPrefix = "local:"

// Local is a key-encryption key held in the process: for `genbox dev` and tests only, as
// whoever has the configuration has every secret.
type Local struct{ gcm cipher.AEAD }

var _ Wrapper = (*Local)(nil)

// NewLocal returns the Local wrapper of key, "local:<base64 of 32 bytes>".
func NewLocal(key string) (*Local, error) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(key, LocalPrefix))
	if err != nil || !strings.HasPrefix(key, LocalPrefix) || len(raw) != 32 {
		return nil, errors.New("secretbox: a local key is local:<standard base64 of 32 bytes>")
	}
	gcm, err := newGCM(raw)
	if err != nil {
		return nil, err
	}
	return &Local{gcm: gcm}, nil
}

// NewLocalKey returns a new random local key.
func NewLocalKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("secretbox: local key: %w", err)
	}
	return LocalPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// Key implements Wrapper.
func (l *Local) Key() string { return "local" }

// Wrap implements Wrapper: the nonce, then the sealed data key.
func (l *Local) Wrap(_ context.Context, dek, aad []byte) ([]byte, error) {
	nonce := make([]byte, l.gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return l.gcm.Seal(nonce, nonce, dek, aad), nil
}

// Unwrap implements Wrapper.
func (l *Local) Unwrap(_ context.Context, wrapped, aad []byte) ([]byte, error) {
	n := l.gcm.NonceSize()
	if len(wrapped) < n {
		return nil, errors.New("secretbox: wrapped key too short")
	}
	return l.gcm.Open(nil, wrapped[:n], wrapped[n:], aad)
}
