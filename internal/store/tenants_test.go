package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/store"
)

// TestWebhookSecretRotation: a rotated secret signs until the overlap ends, a second rotation
// within the overlap keeps the earlier expiry, and expired secrets are dropped.
func TestWebhookSecretRotation(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond) // Firestore keeps microseconds
	clock := t0
	s.Now = func() time.Time { return clock }
	if _, err := s.CreateTenant(ctx, "acme", store.DefaultLimits(), "whsec_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTenant(ctx, "acme", store.DefaultLimits(), "whsec_x"); !errors.Is(err, store.ErrExists) {
		t.Fatalf("duplicate tenant: %v", err)
	}
	got := func() []string {
		t.Helper()
		out, err := s.WebhookSecrets(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if _, err := s.RotateWebhookSecret(ctx, "acme", "whsec_b", time.Hour); err != nil {
		t.Fatal(err)
	}
	clock = t0.Add(30 * time.Minute)
	tn, err := s.RotateWebhookSecret(ctx, "acme", "whsec_c", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if exp := tn.WebhookSecrets[0].ExpiresAt; exp == nil || !exp.Equal(t0.Add(time.Hour)) {
		t.Fatalf("the first secret's expiry moved: %v", exp)
	}
	if s := got(); !slices.Equal(s, []string{"whsec_c", "whsec_b", "whsec_a"}) {
		t.Fatalf("during both overlaps: %v", s)
	}
	clock = t0.Add(61 * time.Minute)
	if s := got(); !slices.Equal(s, []string{"whsec_c", "whsec_b"}) {
		t.Fatalf("after the first overlap: %v", s)
	}
	tn, err = s.RotateWebhookSecret(ctx, "acme", "whsec_d", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(tn.WebhookSecrets) != 3 || tn.WebhookSecrets[0].Secret != "whsec_b" {
		t.Fatalf("the expired secret was not dropped: %+v", tn.WebhookSecrets)
	}
	if _, err := s.WebhookSecrets(ctx, "nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing tenant: %v", err)
	}
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if _, err := s.CreateAPIKey(ctx, "nobody", "gbx_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("key of a missing tenant: %v", err)
	}
	if _, err := s.CreateTenant(ctx, "acme", store.Limits{}, "whsec_a"); err != nil {
		t.Fatal(err)
	}
	k, err := s.CreateAPIKey(ctx, "acme", "gbx_1")
	if err != nil || k.ID != store.APIKeyID("gbx_1") || k.ID == "gbx_1" {
		t.Fatalf("create: %+v %v", k, err)
	}
	if tenant, err := s.Authenticate(ctx, "gbx_1"); err != nil || tenant != "acme" {
		t.Fatalf("authenticate: %q %v", tenant, err)
	}
	if _, err := s.Authenticate(ctx, "gbx_2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
	for range 2 {
		if r, err := s.RevokeAPIKey(ctx, k.ID); err != nil || !r.Revoked {
			t.Fatalf("revoke: %+v %v", r, err)
		}
	}
	if _, err := s.Authenticate(ctx, "gbx_1"); !errors.Is(err, store.ErrRevoked) {
		t.Fatalf("revoked key: %v", err)
	}
}
