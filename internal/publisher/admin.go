package publisher

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// APIKeyPrefix starts every API key, so leaked keys are easy to scan for.
const APIKeyPrefix = "gbx_"

// newAPIKey returns a key of 256 random bits.
func newAPIKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return APIKeyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func tenantView(t *store.Tenant) task.Tenant {
	out := task.Tenant{ID: t.ID, Limits: task.Limits(t.Limits), CreatedAt: t.CreatedAt, WebhookSecrets: []task.SecretInfo{}}
	for _, ws := range t.WebhookSecrets {
		out.WebhookSecrets = append(out.WebhookSecrets, task.SecretInfo{CreatedAt: ws.CreatedAt, ExpiresAt: ws.ExpiresAt})
	}
	return out
}

func keyView(k *store.APIKey) task.APIKey {
	return task.APIKey{KeyID: k.ID, Tenant: k.Tenant, Revoked: k.Revoked, CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt}
}

func checkLimits(prefix string, l task.Limits) error {
	var fs []task.FieldError
	if l.Concurrency < 0 {
		fs = append(fs, task.FieldError{Field: prefix + "concurrency", Detail: "must not be negative"})
	}
	if l.Weight < 0 {
		fs = append(fs, task.FieldError{Field: prefix + "weight", Detail: "must not be negative"})
	}
	if l.SubmitRate < 0 || math.IsInf(l.SubmitRate, 0) {
		fs = append(fs, task.FieldError{Field: prefix + "submit_rate", Detail: "must not be negative"})
	}
	if l.SubmitBurst < 0 {
		fs = append(fs, task.FieldError{Field: prefix + "submit_burst", Detail: "must not be negative"})
	}
	if l.RPM < 0 {
		fs = append(fs, task.FieldError{Field: prefix + "rpm", Detail: "must not be negative"})
	}
	if l.TPM < 0 {
		fs = append(fs, task.FieldError{Field: prefix + "tpm", Detail: "must not be negative"})
	}
	if l.DailyBudgetUSD < 0 || math.IsInf(l.DailyBudgetUSD, 0) {
		fs = append(fs, task.FieldError{Field: prefix + "daily_budget_usd", Detail: "must not be negative"})
	}
	if len(fs) > 0 {
		return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, fs[0].Field+": "+fs[0].Detail, fs...)
	}
	return nil
}

func (s *Server) handleCreateTenant(w http.ResponseWriter, r *http.Request, _ string) error {
	var req task.CreateTenantRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	if len(req.ID) > maxNameLen || !nameRE.MatchString(req.ID) {
		return fieldProblem("id", "must be 1 to %d characters of a-z, 0-9, '_', '.', '-'", maxNameLen)
	}
	limits := store.DefaultLimits()
	if req.Limits != nil {
		if err := checkLimits("limits.", *req.Limits); err != nil {
			return err
		}
		limits = store.Limits(*req.Limits)
	}
	secret, err := s.newSec()
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	t, err := s.st.CreateTenant(ctx, req.ID, limits, secret)
	if errors.Is(err, store.ErrExists) {
		return httpapi.Problem(http.StatusConflict, httpapi.TypeConflict, fmt.Sprintf("tenant %s exists", req.ID))
	}
	if err != nil {
		return err
	}
	out := tenantView(t)
	out.WebhookSecret = secret
	httpapi.JSON(w, http.StatusCreated, "application/json", out)
	return nil
}

func (s *Server) handleGetTenant(w http.ResponseWriter, r *http.Request, _ string) error {
	id, err := pathID(r, "tenant")
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	t, err := s.st.GetTenant(ctx, id)
	if err != nil {
		return err
	}
	httpapi.JSON(w, http.StatusOK, "application/json", tenantView(t))
	return nil
}

func (s *Server) handleSetLimits(w http.ResponseWriter, r *http.Request, _ string) error {
	var l task.Limits
	if err := s.decodeBody(w, r, &l); err != nil {
		return err
	}
	if err := checkLimits("", l); err != nil {
		return err
	}
	id, err := pathID(r, "tenant")
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	t, err := s.st.SetTenantLimits(ctx, id, store.Limits(l))
	if err != nil {
		return err
	}
	s.limits.forget(id)
	httpapi.JSON(w, http.StatusOK, "application/json", tenantView(t))
	return nil
}

func (s *Server) handleCreateKey(w http.ResponseWriter, r *http.Request, _ string) error {
	id, err := pathID(r, "tenant")
	if err != nil {
		return err
	}
	key := newAPIKey()
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	k, err := s.st.CreateAPIKey(ctx, id, key)
	if err != nil {
		return err
	}
	out := keyView(k)
	out.Key = key
	httpapi.JSON(w, http.StatusCreated, "application/json", out)
	return nil
}

func (s *Server) handleRevokeKey(w http.ResponseWriter, r *http.Request, _ string) error {
	id, err := pathID(r, "key_id")
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	k, err := s.st.RevokeAPIKey(ctx, id)
	if err != nil {
		return err
	}
	s.keys.markRevoked(id)
	httpapi.JSON(w, http.StatusOK, "application/json", keyView(k))
	return nil
}

func (s *Server) handleRotateSecret(w http.ResponseWriter, r *http.Request, _ string) error {
	secret, err := s.newSec()
	if err != nil {
		return err
	}
	id, err := pathID(r, "tenant")
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	t, err := s.st.RotateWebhookSecret(ctx, id, secret, s.cfg.SecretOverlap)
	if err != nil {
		return err
	}
	out := task.RotatedSecret{Tenant: id, WebhookSecret: secret}
	for _, ws := range t.WebhookSecrets {
		if ws.ExpiresAt != nil && ws.ExpiresAt.After(out.PreviousExpireAt) {
			out.PreviousExpireAt = *ws.ExpiresAt
		}
	}
	httpapi.JSON(w, http.StatusOK, "application/json", out)
	return nil
}
