package publisher

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

func TestAdmin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var p *task.Problem
	status := func(err error) int {
		if errors.As(err, &p) {
			return p.Status
		}
		return 0
	}
	// The admin key guards every admin route; an API key is not an admin key.
	if _, err := client.New(e.url, "").CreateTenant(ctx, "x", nil); status(err) != 401 {
		t.Fatalf("no key: %v", err)
	}
	for _, key := range []string{"wrong-admin-key-123456", e.key} {
		if _, err := client.New(e.url, key, client.WithRetries(0)).CreateTenant(ctx, "x", nil); status(err) != 403 {
			t.Fatalf("key %q: %v", key, err)
		}
	}
	// Create with defaults, read back, refuse a duplicate and bad ids and limits.
	tn, err := e.admin.CreateTenant(ctx, "initech", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(tn.Limits, task.Limits(store.DefaultLimits())) || !strings.HasPrefix(tn.WebhookSecret, webhook.SecretPrefix) || len(tn.WebhookSecrets) != 1 {
		t.Fatalf("created %+v", tn)
	}
	if _, err := webhook.ParseSecret(tn.WebhookSecret); err != nil {
		t.Fatalf("secret format: %v", err)
	}
	got, err := e.admin.GetTenant(ctx, "initech")
	if err != nil || got.WebhookSecret != "" || got.ID != "initech" {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := e.admin.CreateTenant(ctx, "initech", nil); status(err) != 409 {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := e.admin.CreateTenant(ctx, "Not Valid", nil); status(err) != 400 || !slices.Contains(fields(*p), "id") {
		t.Fatalf("bad id: %v", err)
	}
	if _, err := e.admin.CreateTenant(ctx, "neg", &task.Limits{SubmitRate: -1}); status(err) != 400 || !slices.Contains(fields(*p), "limits.submit_rate") {
		t.Fatalf("bad limits: %v", err)
	}
	if _, err := e.admin.GetTenant(ctx, "__reserved__"); status(err) != 404 {
		t.Fatalf("reserved tenant id: %v", err)
	}
	if _, err := e.admin.GetTenant(ctx, "nobody"); status(err) != 404 {
		t.Fatalf("missing tenant: %v", err)
	}
	// Limits.
	want := task.Limits{Concurrency: 3, Weight: 3, SubmitRate: 5, SubmitBurst: 7, DailyBudgetUSD: 12.5, RPM: 120, TPM: 60_000}
	if tn, err := e.admin.SetLimits(ctx, "initech", want); err != nil || !reflect.DeepEqual(tn.Limits, want) {
		t.Fatalf("set limits: %+v %v", tn, err)
	}
	if _, err := e.admin.SetLimits(ctx, "initech", task.Limits{SubmitBurst: -1}); status(err) != 400 || !slices.Contains(fields(*p), "submit_burst") {
		t.Fatalf("bad limits: %v", err)
	}
	for field, l := range map[string]task.Limits{"rpm": {RPM: -1}, "tpm": {TPM: -1}, "weight": {Weight: -1}} {
		if _, err := e.admin.SetLimits(ctx, "initech", l); status(err) != 400 || !slices.Contains(fields(*p), field) {
			t.Fatalf("%s negative: %v", field, err)
		}
	}
	if _, err := e.admin.SetLimits(ctx, "nobody", want); status(err) != 404 {
		t.Fatalf("limits of a missing tenant: %v", err)
	}
	// Keys.
	if _, err := e.admin.CreateAPIKey(ctx, "nobody"); status(err) != 404 {
		t.Fatalf("key of a missing tenant: %v", err)
	}
	k, err := e.admin.CreateAPIKey(ctx, "initech")
	if err != nil || !strings.HasPrefix(k.Key, APIKeyPrefix) || k.KeyID != store.APIKeyID(k.Key) || k.Revoked {
		t.Fatalf("key: %+v %v", k, err)
	}
	if r, err := e.admin.RevokeAPIKey(ctx, k.KeyID); err != nil || !r.Revoked || r.Key != "" || r.RevokedAt == nil {
		t.Fatalf("revoke: %+v %v", r, err)
	}
	if _, err := e.admin.RevokeAPIKey(ctx, "no-such-key"); status(err) != 404 {
		t.Fatalf("revoke a missing key: %v", err)
	}
	// Rotation: both secrets sign during the overlap, then only the new one.
	rot, err := e.admin.RotateWebhookSecret(ctx, "initech")
	if err != nil || rot.WebhookSecret == tn.WebhookSecret || !strings.HasPrefix(rot.WebhookSecret, webhook.SecretPrefix) {
		t.Fatalf("rotate: %+v %v", rot, err)
	}
	if d := time.Until(rot.PreviousExpireAt); d < e.cfg.SecretOverlap-time.Minute || d > e.cfg.SecretOverlap {
		t.Fatalf("previous secret expires in %s, want %s", d, e.cfg.SecretOverlap)
	}
	secrets, err := e.st.WebhookSecrets(ctx, "initech")
	if err != nil || !slices.Equal(secrets, []string{rot.WebhookSecret, tn.WebhookSecret}) {
		t.Fatalf("secrets during the overlap: %v %v", secrets, err)
	}
	later := *e.st
	later.Now = func() time.Time { return time.Now().Add(e.cfg.SecretOverlap + time.Minute) }
	if secrets, err := later.WebhookSecrets(ctx, "initech"); err != nil || !slices.Equal(secrets, []string{rot.WebhookSecret}) {
		t.Fatalf("secrets after the overlap: %v %v", secrets, err)
	}
	if _, err := e.admin.RotateWebhookSecret(ctx, "nobody"); status(err) != 404 {
		t.Fatalf("rotate a missing tenant: %v", err)
	}
}

func TestAdminDisabled(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config, _ *Deps) { c.AdminKey = "" })
	code, h, body := e.do("POST", "/admin/v1/tenants", "anything-at-all-123", []byte(`{"id":"x"}`), nil)
	if p := problemOf(t, h, body); code != 403 || p.Type != httpapi.ProblemBase+httpapi.TypeForbidden {
		t.Fatalf("disabled admin: %d %s", code, body)
	}
}
