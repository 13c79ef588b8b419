package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/task"
)

// DefaultOutputTTL is how long a cached output is kept.
const DefaultOutputTTL = 24 * time.Hour

// Output is the outputs/{fingerprint} document: a cached generation. The fingerprint
// (gemini.Fingerprint) covers the tenant and everything that shaped the output; the tenant is
// stored too and checked on every read, so no tenant ever sees another's output or cost.
// Only a fresh, non-degraded, non-stale output of a request that asked for caching belongs here.
type Output struct {
	Fingerprint   string     `firestore:"-"`
	Tenant        string     `firestore:"tenant"`
	Payload       string     `firestore:"payload"`
	Model         string     `firestore:"model"`
	PromptVersion string     `firestore:"prompt_version,omitempty"`
	Usage         task.Usage `firestore:"usage"`
	CostUSD       float64    `firestore:"cost_usd"`
	TaskID        string     `firestore:"task_id,omitempty"` // the task that paid for it
	CreatedAt     time.Time  `firestore:"created_at"`
	ExpireAt      time.Time  `firestore:"expire_at"` // Firestore TTL deletes it some time after
}

// GetOutput reads a cached output of tenant. It returns ErrNotFound when there is none, when it
// has expired (TTL deletion lags by up to a day) or when it belongs to another tenant.
func (s *Store) GetOutput(ctx context.Context, tenant, fingerprint string) (*Output, error) {
	snap, err := s.FS.Collection(OutputsCollection).Doc(fingerprint).Get(ctx)
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("get output %s: %w", fingerprint, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get output %s: %w", fingerprint, err)
	}
	var o Output
	if err := snap.DataTo(&o); err != nil {
		return nil, fmt.Errorf("decode output %s: %w", fingerprint, err)
	}
	if o.Tenant != tenant || !s.now().Before(o.ExpireAt) {
		return nil, fmt.Errorf("get output %s: %w", fingerprint, ErrNotFound)
	}
	o.Fingerprint = fingerprint
	return &o, nil
}

// PutOutput caches o under o.Fingerprint for ttl (DefaultOutputTTL when 0), replacing an older entry.
func (s *Store) PutOutput(ctx context.Context, o *Output, ttl time.Duration) error {
	if o.Fingerprint == "" || o.Tenant == "" {
		return fmt.Errorf("put output: fingerprint and tenant are required")
	}
	if ttl <= 0 {
		ttl = DefaultOutputTTL
	}
	now := s.now()
	o.CreatedAt, o.ExpireAt = now, now.Add(ttl)
	if _, err := s.FS.Collection(OutputsCollection).Doc(o.Fingerprint).Set(ctx, o); err != nil {
		return fmt.Errorf("put output %s: %w", o.Fingerprint, err)
	}
	return nil
}

// DefaultLastGoodTTL is how long the last good output of a subject is kept for stale answers.
const DefaultLastGoodTTL = 30 * 24 * time.Hour

// lastGoodID is the outputs document holding the last good output of a tenant's subject in a
// family variant (on_exhausted: stale). It cannot collide with a fingerprint (hex only).
func lastGoodID(tenant, family, variant, subjectKey string) string {
	b, _ := json.Marshal([]string{tenant, family, variant, subjectKey}) // strings always marshal
	sum := sha256.Sum256(b)
	return "last-good:" + hex.EncodeToString(sum[:])
}

// PutLastGood records o as the last good output of tenant's subjectKey in family/variant; a
// family with on_exhausted: stale answers with it when every model is unavailable. Record only
// fresh outputs (never a stale one).
func (s *Store) PutLastGood(ctx context.Context, family, variant, subjectKey string, o *Output, ttl time.Duration) error {
	if subjectKey == "" || o.Tenant == "" {
		return fmt.Errorf("put last good output: tenant and subject key are required")
	}
	if ttl <= 0 {
		ttl = DefaultLastGoodTTL
	}
	now := s.now()
	doc := *o
	doc.CreatedAt, doc.ExpireAt = now, now.Add(ttl)
	id := lastGoodID(o.Tenant, family, variant, subjectKey)
	if _, err := s.FS.Collection(OutputsCollection).Doc(id).Set(ctx, doc); err != nil {
		return fmt.Errorf("put last good output of %s/%s: %w", family, variant, err)
	}
	return nil
}

// GetLastGood reads the last good output of tenant's subjectKey in family/variant, or ErrNotFound.
func (s *Store) GetLastGood(ctx context.Context, tenant, family, variant, subjectKey string) (*Output, error) {
	return s.GetOutput(ctx, tenant, lastGoodID(tenant, family, variant, subjectKey))
}
