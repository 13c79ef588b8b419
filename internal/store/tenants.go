package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/secretbox"
)

// Limits are a tenant's quotas. A zero value means "no limit" for that quota.
type Limits struct {
	// Concurrency caps the tenant's tasks running at once across every worker instance.
	Concurrency int `firestore:"concurrency" json:"concurrency"`
	// Weight is the tenant's part of the worker pool's slots when tenants together want more
	// than the pool holds (fairshare.Allot); 0 counts as 1.
	Weight int `firestore:"weight" json:"weight,omitempty"`
	// SubmitRate is the sustained submissions per second the publisher accepts.
	SubmitRate float64 `firestore:"submit_rate" json:"submit_rate"`
	// SubmitBurst is how many submissions may arrive at once above SubmitRate.
	SubmitBurst int `firestore:"submit_burst" json:"submit_burst"`
	// DailyBudgetUSD is the soft daily spending limit.
	DailyBudgetUSD float64 `firestore:"daily_budget_usd" json:"daily_budget_usd"`
	// RPM and TPM are the tenant's share of the model quota: model calls and tokens per minute,
	// held across every worker instance (quota.TenantRates).
	RPM int64 `firestore:"rpm" json:"rpm,omitempty"`
	TPM int64 `firestore:"tpm" json:"tpm,omitempty"`
	// AllowedBuckets are the Cloud Storage buckets whose objects the tenant may name by gs:// URI.
	AllowedBuckets []string `firestore:"allowed_buckets,omitempty" json:"allowed_buckets,omitempty"`
}

// DefaultLimits are the limits of a tenant created without any.
func DefaultLimits() Limits {
	return Limits{Concurrency: 10, SubmitRate: 50, SubmitBurst: 100}
}

// WebhookSecret is one of a tenant's webhook signing secrets. A secret without ExpiresAt signs
// until it is rotated; a rotated one keeps signing until ExpiresAt so receivers can switch over.
// It is stored sealed (Store.Secrets); Secret holds it in plain text only in documents written
// before secrets were sealed, until the next rotation seals it.
type WebhookSecret struct {
	Sealed    *secretbox.Sealed `firestore:"sealed,omitempty"`
	Secret    string            `firestore:"secret,omitempty"`
	CreatedAt time.Time         `firestore:"created_at"`
	ExpiresAt *time.Time        `firestore:"expires_at,omitempty"`
}

// Active reports whether the secret still signs at now.
func (s WebhookSecret) Active(now time.Time) bool {
	return s.ExpiresAt == nil || now.Before(*s.ExpiresAt)
}

// Tenant is the tenants/{id} document.
type Tenant struct {
	ID             string          `firestore:"-"`
	Limits         Limits          `firestore:"limits"`
	WebhookSecrets []WebhookSecret `firestore:"webhook_secrets"`
	CreatedAt      time.Time       `firestore:"created_at"`
	UpdatedAt      time.Time       `firestore:"updated_at"`
}

// Tenants returns the tenants collection.
func (s *Store) Tenants() *firestore.CollectionRef { return s.FS.Collection(TenantsCollection) }

// ErrNoSecretBox means the Store has no Secrets box to seal or open webhook secrets with.
var ErrNoSecretBox = errors.New("store: no box for webhook secrets (GENBOX_WEBHOOK_SECRETS_KEY)")

// seal seals secret, one of tenant's, with the Store's box.
func (s *Store) seal(ctx context.Context, tenant, secret string) (*secretbox.Sealed, error) {
	if s.Secrets == nil {
		return nil, ErrNoSecretBox
	}
	sealed, err := s.Secrets.Seal(ctx, tenant, secret)
	if err != nil {
		return nil, err
	}
	return &sealed, nil
}

// CreateTenant writes a new tenant with its first webhook secret, sealed. It fails with
// ErrExists when the id is taken.
func (s *Store) CreateTenant(ctx context.Context, id string, limits Limits, secret string) (*Tenant, error) {
	sealed, err := s.seal(ctx, id, secret)
	if err != nil {
		return nil, fmt.Errorf("create tenant %s: %w", id, err)
	}
	now := s.now()
	t := &Tenant{ID: id, Limits: limits, CreatedAt: now, UpdatedAt: now,
		WebhookSecrets: []WebhookSecret{{Sealed: sealed, CreatedAt: now}}}
	_, err = s.Tenants().Doc(id).Create(ctx, t)
	if status.Code(err) == codes.AlreadyExists {
		return nil, fmt.Errorf("create tenant %s: %w", id, ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("create tenant %s: %w", id, err)
	}
	return t, nil
}

// GetTenant reads one tenant.
func (s *Store) GetTenant(ctx context.Context, id string) (*Tenant, error) {
	return getDoc(ctx, s.Tenants().Doc(id), "tenant", decodeTenant)
}

func decodeTenant(snap *firestore.DocumentSnapshot) (*Tenant, error) {
	var t Tenant
	if err := snap.DataTo(&t); err != nil {
		return nil, fmt.Errorf("decode tenant %s: %w", snap.Ref.ID, err)
	}
	t.ID = snap.Ref.ID
	return &t, nil
}

// mutateTenant is the tenant's read-modify-write.
func (s *Store) mutateTenant(ctx context.Context, id string, fn func(t *Tenant, now time.Time) error) (*Tenant, error) {
	t, err := mutateDoc(ctx, s, s.Tenants().Doc(id), decodeTenant, func(t *Tenant, now time.Time) error {
		if err := fn(t, now); err != nil {
			return err
		}
		t.UpdatedAt = now
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("update tenant %s: %w", id, err)
	}
	return t, nil
}

// SetTenantLimits replaces a tenant's limits.
func (s *Store) SetTenantLimits(ctx context.Context, id string, limits Limits) (*Tenant, error) {
	return s.mutateTenant(ctx, id, func(t *Tenant, _ time.Time) error { t.Limits = limits; return nil })
}

// RotateWebhookSecret adds secret, sealed, as the tenant's newest signing secret. Every secret
// that was active keeps signing until now+overlap (or its own earlier expiry), sealed now if it
// was stored in plain text; expired ones are dropped.
func (s *Store) RotateWebhookSecret(ctx context.Context, id, secret string, overlap time.Duration) (*Tenant, error) {
	sealed, err := s.seal(ctx, id, secret)
	if err != nil {
		return nil, fmt.Errorf("rotate the webhook secret of %s: %w", id, err)
	}
	return s.mutateTenant(ctx, id, func(t *Tenant, now time.Time) error {
		until := now.Add(overlap)
		kept := t.WebhookSecrets[:0]
		for _, ws := range t.WebhookSecrets {
			if !ws.Active(now) {
				continue
			}
			if ws.ExpiresAt == nil || ws.ExpiresAt.After(until) {
				ws.ExpiresAt = &until
			}
			if ws.Sealed == nil {
				if ws.Sealed, err = s.seal(ctx, id, ws.Secret); err != nil {
					return err
				}
				ws.Secret = ""
			}
			kept = append(kept, ws)
		}
		t.WebhookSecrets = append(kept, WebhookSecret{Sealed: sealed, CreatedAt: now})
		return nil
	})
}

// WebhookSecrets returns the tenant's secrets that sign now, opened, newest first: one signature
// per active secret goes on every webhook.
func (s *Store) WebhookSecrets(ctx context.Context, tenant string) ([]string, error) {
	t, err := s.GetTenant(ctx, tenant)
	if err != nil {
		return nil, err
	}
	now := s.now()
	var out []string
	for _, ws := range slices.Backward(t.WebhookSecrets) {
		switch {
		case !ws.Active(now):
		case ws.Sealed == nil:
			out = append(out, ws.Secret)
		case s.Secrets == nil:
			return nil, fmt.Errorf("webhook secrets of tenant %s: %w", tenant, ErrNoSecretBox)
		default:
			plain, err := s.Secrets.Open(ctx, tenant, *ws.Sealed)
			if err != nil {
				return nil, fmt.Errorf("webhook secrets of tenant %s: %w", tenant, err)
			}
			out = append(out, plain)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("webhook secrets of tenant %s: %w", tenant, ErrNoSecret)
	}
	return out, nil
}

// ErrNoSecret means a tenant has no active webhook secret.
var ErrNoSecret = errors.New("store: no active webhook secret")
