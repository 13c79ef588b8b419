package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"google.golang.org/api/idtoken"
)

// ErrPushAuth means a push request does not carry a valid OIDC token of the push service account
// for the expected audience.
var ErrPushAuth = errors.New("bus: push request not authenticated")

// googleIssuers are the issuers of Google-signed ID tokens, Pub/Sub push tokens among them.
var googleIssuers = map[string]bool{"https://accounts.google.com": true, "accounts.google.com": true}

// TokenValidator checks a Google-signed ID token's signature, expiry and audience and returns
// its claims; *idtoken.Validator is one.
type TokenValidator interface {
	Validate(ctx context.Context, token, audience string) (*idtoken.Payload, error)
}

var _ TokenValidator = (*idtoken.Validator)(nil)

// validateFunc adapts idtoken.Validate (Google's certificates over http.DefaultClient, cached
// as long as Google's Cache-Control allows) to TokenValidator.
type validateFunc func(ctx context.Context, token, audience string) (*idtoken.Payload, error)

func (f validateFunc) Validate(ctx context.Context, token, audience string) (*idtoken.Payload, error) {
	return f(ctx, token, audience)
}

// PushAuth says which OIDC tokens VerifyPush admits: those Google signed for Audience (the push
// subscription's oidc_token.audience) on behalf of ServiceAccount (its service account email).
type PushAuth struct {
	Audience       string
	ServiceAccount string
	// Validator checks signature, expiry and audience; nil uses idtoken.Validate.
	Validator TokenValidator
}

// EnvUnauthenticatedPush, set true, lets a push route without push authentication admit
// requests that carry no token: for genbox dev and tests on one machine, never for a deployment.
const EnvUnauthenticatedPush = "GENBOX_UNAUTHENTICATED_PUSH"

// PushRoute is the handler of a service's push route: Push(h) behind VerifyPush, so that with
// push authentication unset every request is refused, unless unauthenticated (the service's
// EnvUnauthenticatedPush) says explicitly that this is local use.
func PushRoute(h Handler, a PushAuth, unauthenticated bool, log *slog.Logger) http.Handler {
	push := Push(h, log)
	if unauthenticated && !a.Enabled() {
		log.Warn("push requests are not authenticated (" + EnvUnauthenticatedPush + " is set): local use only")
		return push
	}
	return VerifyPush(push, a, log)
}

// Enabled reports whether both Audience and ServiceAccount are set: a service verifies pushes
// only then.
func (a PushAuth) Enabled() bool { return a.Audience != "" && a.ServiceAccount != "" }

// VerifyPush wraps a push handler (see Push) so that next runs only for a request whose
// "Authorization: Bearer <jwt>" is an ID token with a valid Google signature, not expired, for
// a.Audience, issued by Google, with email a.ServiceAccount and email_verified true. Any other
// request gets 401 (a problem document) and next is never called; with Audience or
// ServiceAccount empty every request is refused (fail closed).
func VerifyPush(next http.Handler, a PushAuth, log *slog.Logger) http.Handler {
	if a.Validator == nil {
		a.Validator = validateFunc(idtoken.Validate)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := a.verify(r.Context(), r.Header.Get("Authorization")); err != nil {
			log.WarnContext(r.Context(), "push: request refused", "error", err)
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			writeProblem(w, http.StatusUnauthorized, "a valid Pub/Sub push OIDC token is required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// verify checks an Authorization header value; every failure wraps ErrPushAuth.
func (a PushAuth) verify(ctx context.Context, authorization string) error {
	if !a.Enabled() {
		return fmt.Errorf("%w: push authentication is not configured", ErrPushAuth)
	}
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return fmt.Errorf("%w: no Bearer token", ErrPushAuth)
	}
	p, err := a.Validator.Validate(ctx, token, a.Audience)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPushAuth, err)
	}
	// idtoken skips the audience check for an empty audience; Enabled excludes it, and this
	// keeps a Validator that does the same from admitting any audience.
	if p.Audience != a.Audience {
		return fmt.Errorf("%w: token audience is not the push audience", ErrPushAuth)
	}
	if !googleIssuers[p.Issuer] {
		return fmt.Errorf("%w: token issuer %q is not Google", ErrPushAuth, p.Issuer)
	}
	if email, _ := p.Claims["email"].(string); email != a.ServiceAccount {
		return fmt.Errorf("%w: token email is not the push service account", ErrPushAuth)
	}
	if verified, _ := p.Claims["email_verified"].(bool); !verified {
		return fmt.Errorf("%w: token email is not verified", ErrPushAuth)
	}
	return nil
}
