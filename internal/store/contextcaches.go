package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/firestore"
)

// ContextCachesCollection holds the context_caches documents.
const ContextCachesCollection = "context_caches"

// ContextCache is the context_caches/{tenant}-{model}-{prefix sha256} document (docs/cost.md):
// the explicit Gemini cache of one tenant's prefix for one model, and, at the top level as
// claim.Doc keeps it (owner, epoch, expires_at), the creation lease that makes its creation a
// single flight across instances. A tenant's prefix is never looked up under another tenant.
type ContextCache struct {
	Tenant    string `firestore:"tenant"`
	Model     string `firestore:"model"`
	PrefixSHA string `firestore:"prefix_sha"`
	// Name is the cachedContents/{id} resource, once created.
	Name          string     `firestore:"name,omitempty"`
	CacheExpireAt *time.Time `firestore:"cache_expire_at,omitempty"`
	Tokens        int64      `firestore:"tokens,omitempty"`
	UpdatedAt     time.Time  `firestore:"updated_at"`
}

// PrefixSHA is the hex SHA-256 of a prefix: how its cache is named.
func PrefixSHA(prefix string) string {
	sum := sha256.Sum256([]byte(prefix))
	return hex.EncodeToString(sum[:])
}

// ContextCacheID is the document id of tenant's prefix cached for model.
func ContextCacheID(tenant, model, prefix string) string {
	clean := strings.NewReplacer("/", "~").Replace
	return clean(tenant) + "-" + clean(model) + "-" + PrefixSHA(prefix)
}

// ContextCacheRef is the document of id, for the creation lease (claim.Doc).
func (s *Store) ContextCacheRef(id string) *firestore.DocumentRef {
	return s.FS.Collection(ContextCachesCollection).Doc(id)
}

// GetContextCache reads the cache document of id.
func (s *Store) GetContextCache(ctx context.Context, id string) (*ContextCache, error) {
	return getDoc(ctx, s.ContextCacheRef(id), "context cache", func(snap *firestore.DocumentSnapshot) (*ContextCache, error) {
		var c ContextCache
		if err := snap.DataTo(&c); err != nil {
			return nil, fmt.Errorf("decode context cache %s: %w", id, err)
		}
		return &c, nil
	})
}

// SaveContextCache records a created or extended cache, leaving the creation lease as it is.
func (s *Store) SaveContextCache(ctx context.Context, id string, c ContextCache) error {
	c.UpdatedAt = s.now()
	_, err := s.ContextCacheRef(id).Set(ctx, map[string]any{
		"tenant": c.Tenant, "model": c.Model, "prefix_sha": c.PrefixSHA, "name": c.Name,
		"cache_expire_at": c.CacheExpireAt, "tokens": c.Tokens, "updated_at": c.UpdatedAt,
	}, firestore.MergeAll)
	if err != nil {
		return fmt.Errorf("save context cache %s: %w", id, err)
	}
	return nil
}
