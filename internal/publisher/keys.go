package publisher

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/backoff"
)

// keys resolves API keys to tenants, from memory where that is safe. A key's tenant never
// changes and a revocation is permanent, so a key read once stays good until it is revoked, and
// Firestore's listener on revoked keys (store.WatchRevokedKeys) tells every instance when that
// happens; the instance that revokes a key marks it at once. While the listener is not current
// (not started yet, or broken and restarting), a key the listener would have to vouch for is read
// from Firestore on every request. A listener can also stall without failing (the Firestore
// client retries a broken stream inside its iterator; Cloud Run throttles the CPU of an idle
// instance), so a key is trusted from memory for keysMaxAge at most and then read again.
type keys struct {
	st  *store.Store
	log *slog.Logger

	mu      sync.Mutex
	current bool                // the listener has delivered every revoked key and runs
	valid   map[string]validKey // key id → the key as last read and found valid
	revoked map[string]bool     // key ids seen revoked, by the listener or by this instance
}

// keysMaxAge bounds how long a key read from Firestore is trusted from memory: the longest a
// revocation can take to reach an instance whose listener has stalled.
const keysMaxAge = time.Minute

// validKey is a key found valid: its tenant, and when it was read.
type validKey struct {
	tenant string
	read   time.Time
}

func newKeys(st *store.Store, log *slog.Logger) *keys {
	return &keys{st: st, log: log, valid: map[string]validKey{}, revoked: map[string]bool{}}
}

// authenticate returns key's tenant: store.ErrNotFound for an unknown key, store.ErrRevoked for
// a revoked one.
func (k *keys) authenticate(ctx context.Context, key string) (string, error) {
	id := store.APIKeyID(key)
	now := k.st.Now()
	k.mu.Lock()
	v, known := k.valid[id]
	revoked, current := k.revoked[id], k.current
	k.mu.Unlock()
	if revoked {
		return "", store.ErrRevoked
	}
	if known && current && now.Sub(v.read) < keysMaxAge {
		return v.tenant, nil
	}
	tenant, err := k.st.Authenticate(ctx, key)
	switch {
	case err == nil:
		k.mu.Lock()
		k.valid[id] = validKey{tenant: tenant, read: now}
		k.mu.Unlock()
	case errors.Is(err, store.ErrRevoked):
		k.markRevoked(id)
	}
	return tenant, err
}

// markRevoked records that the key with id is revoked. A revoked mark is never cleared, so a read
// that raced with the revocation cannot bring the key back.
func (k *keys) markRevoked(ids ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, id := range ids {
		k.revoked[id] = true
	}
}

// keysRetry spaces the listener's restarts; a listener that delivered a snapshot starts over.
var keysRetry = backoff.Policy{Base: 500 * time.Millisecond, Max: 30 * time.Second}

// watch keeps the revocation listener running until ctx ends, restarting it after a failure.
func (k *keys) watch(ctx context.Context) {
	failures := 0
	for {
		err := k.st.WatchRevokedKeys(ctx, func(ids []string) {
			k.markRevoked(ids...)
			k.mu.Lock()
			k.current = true
			k.mu.Unlock()
			failures = 0
		})
		k.mu.Lock()
		k.current = false
		k.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := keysRetry.Ceiling(failures)
		k.log.WarnContext(ctx, "API key revocation listener stopped; keys are read on every request until it is back", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
