// Package httpapi is how genbox's servers answer API clients over HTTP: errors as RFC 9457
// problem documents (task.Problem, the public shape docs/api.md describes),
// JSON answers, the Bearer credential of a request, and the admin key check. The publisher, the
// dlqnotifier, the resulthandler's push route and the console all answer through it, so a
// client reads every service's errors the same way.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/pkg/task"
)

// ProblemBase prefixes every problem type URI.
const ProblemBase = "https://genbox.dev/problems/"

// Problem type slugs shared by the services; a service may add its own.
const (
	TypeInvalid     = "invalid-request"
	TypeUnauth      = "unauthenticated"
	TypeForbidden   = "forbidden"
	TypeNotFound    = "not-found"
	TypeNoRoute     = "no-route"
	TypeMethod      = "method-not-allowed"
	TypeConflict    = "conflict"
	TypeTooLarge    = "body-too-large"
	TypeMedia       = "unsupported-media-type"
	TypeRateLimited = "rate-limited"
	TypeUnavailable = "unavailable"
	TypeInternal    = "internal"
)

// statusTypes is the type of a problem known only by its status.
var statusTypes = map[int]string{
	http.StatusBadRequest: TypeInvalid, http.StatusUnauthorized: TypeUnauth, http.StatusForbidden: TypeForbidden,
	http.StatusNotFound: TypeNotFound, http.StatusMethodNotAllowed: TypeMethod, http.StatusConflict: TypeConflict,
	http.StatusRequestEntityTooLarge: TypeTooLarge, http.StatusUnsupportedMediaType: TypeMedia,
	http.StatusTooManyRequests: TypeRateLimited, http.StatusServiceUnavailable: TypeUnavailable,
	http.StatusInternalServerError: TypeInternal,
}

// Problem builds a problem of the slug's type; fields name the refused request fields.
func Problem(status int, slug, detail string, fields ...task.FieldError) *task.Problem {
	return &task.Problem{Type: ProblemBase + slug, Title: http.StatusText(status), Status: status, Detail: detail, Errors: fields}
}

// ProblemFor is what a server answers for err: a Problem as it is; what own maps it to, when own
// is not nil and returns one (a service's own errors); a body over its limit 413; a store that
// is unavailable, timed out or contended 503 with a Retry-After, for the client to retry; else
// 500. Each service's errors go through it, so the same failure gets the same answer everywhere.
func ProblemFor(err error, own func(error) *task.Problem) *task.Problem {
	var p *task.Problem
	if errors.As(err, &p) {
		return p
	}
	if own != nil {
		if p := own(err); p != nil {
			return p
		}
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return Problem(http.StatusRequestEntityTooLarge, TypeTooLarge, fmt.Sprintf("the body exceeds %d bytes", mbe.Limit))
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), status.Code(err) == codes.Unavailable,
		status.Code(err) == codes.DeadlineExceeded, status.Code(err) == codes.Aborted:
		p := Problem(http.StatusServiceUnavailable, TypeUnavailable, "the store is unavailable; retry")
		p.RetryAfter = time.Second
		return p
	}
	return Problem(http.StatusInternalServerError, TypeInternal, "internal error")
}

// StatusProblem builds a problem whose type follows from its status alone.
func StatusProblem(status int, detail string) *task.Problem {
	slug, ok := statusTypes[status]
	if !ok {
		slug = TypeInternal
		if status < 500 {
			slug = TypeInvalid
		}
	}
	return Problem(status, slug, detail)
}

// Error answers p as problem+json, with its Retry-After. A 5xx is logged with cause, which the
// client never sees: the detail of a 5xx says only that it failed.
func Error(w http.ResponseWriter, r *http.Request, log *slog.Logger, p *task.Problem, cause error) {
	if p.Status >= 500 {
		log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "status", p.Status, "error", cause)
	}
	if p.RetryAfter > 0 {
		SetRetryAfter(w.Header(), p.RetryAfter)
	}
	JSON(w, p.Status, task.ProblemContentType, p)
}

// SetRetryAfter sets h's Retry-After to d in whole seconds, rounded up.
func SetRetryAfter(h http.Header, d time.Duration) {
	h.Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
}

// JSON answers v as JSON of contentType with status, newline-terminated and with its length.
func JSON(w http.ResponseWriter, status int, contentType string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"title":"Internal Server Error","status":500}`)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// Bearer returns the credential of r's "Authorization: Bearer <credential>" header (the scheme
// in any case, RFC 9110) and whether there is one.
func Bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	cred := strings.TrimSpace(h[len(prefix):])
	return cred, cred != ""
}

// Failed counts r's failed credential in fails and returns a 429 with Retry-After once its
// client's failures, or every client's, are past their limits; nil while they are within them,
// when the caller answers its own refusal. Call it only once a credential has been checked and
// found wrong: a valid one is never refused for anyone's failures.
func Failed(fails *authlimit.Limiter, r *http.Request) *task.Problem {
	wait := fails.Failed(r)
	if wait <= 0 {
		return nil
	}
	p := Problem(http.StatusTooManyRequests, TypeRateLimited, "too many failed authentications from this client; retry later")
	p.RetryAfter = wait
	return p
}
