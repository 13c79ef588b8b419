package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/secretbox"
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
	if len(tn.WebhookSecrets) != 3 || !tn.WebhookSecrets[0].CreatedAt.Equal(t0) {
		t.Fatalf("the expired secret was not dropped: %+v", tn.WebhookSecrets)
	}
	if s := got(); !slices.Equal(s, []string{"whsec_d", "whsec_c", "whsec_b"}) {
		t.Fatalf("after the third rotation: %v", s)
	}
	if _, err := s.WebhookSecrets(ctx, "nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing tenant: %v", err)
	}
}

// Webhook secrets are stored sealed: the tenant document holds no secret in plain text, only a
// service holding the key opens them, and a document of before the sealing (plain text) keeps
// signing and is sealed by the next rotation.
func TestWebhookSecretsSealedAtRest(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	if _, err := s.CreateTenant(ctx, "acme", store.DefaultLimits(), secret); err != nil {
		t.Fatal(err)
	}
	raw := func(id string) string {
		t.Helper()
		snap, err := s.Tenants().Doc(id).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%v", snap.Data())
	}
	if doc := raw("acme"); strings.Contains(doc, "MfKQ9r8G") || !strings.Contains(doc, "wrapped_key") {
		t.Fatalf("the tenant document holds the secret or no sealed one: %s", doc)
	}
	if got, err := s.WebhookSecrets(ctx, "acme"); err != nil || !slices.Equal(got, []string{secret}) {
		t.Fatalf("opened: %v %v", got, err)
	}
	reader := store.New(s.FS) // a service without the key: the worker, the dlqnotifier
	if _, err := reader.WebhookSecrets(ctx, "acme"); !errors.Is(err, store.ErrNoSecretBox) {
		t.Errorf("opened without a box: %v, want ErrNoSecretBox", err)
	}
	if _, err := reader.GetTenant(ctx, "acme"); err != nil {
		t.Errorf("the tenant's limits are readable without the key: %v", err)
	}
	key, err := secretbox.NewLocalKey()
	if err != nil {
		t.Fatal(err)
	}
	if reader.Secrets, _, err = secretbox.FromKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.WebhookSecrets(ctx, "acme"); err == nil {
		t.Error("opened with another key")
	}

	legacy := map[string]any{"limits": map[string]any{"concurrency": 1}, "created_at": s.Now(), "updated_at": s.Now(),
		"webhook_secrets": []any{map[string]any{"secret": "whsec_plain", "created_at": s.Now()}}}
	if _, err := s.Tenants().Doc("legacy").Create(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	if got, err := s.WebhookSecrets(ctx, "legacy"); err != nil || !slices.Equal(got, []string{"whsec_plain"}) {
		t.Fatalf("a plain-text secret of before: %v %v, want it still signing", got, err)
	}
	if _, err := s.RotateWebhookSecret(ctx, "legacy", "whsec_new", time.Hour); err != nil {
		t.Fatal(err)
	}
	if doc := raw("legacy"); strings.Contains(doc, "whsec_plain") || strings.Contains(doc, "whsec_new") {
		t.Fatalf("plain text left after the rotation: %s", doc)
	}
	if got, err := s.WebhookSecrets(ctx, "legacy"); err != nil || !slices.Equal(got, []string{"whsec_new", "whsec_plain"}) {
		t.Fatalf("after the rotation: %v %v, want both signing through the overlap", got, err)
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
