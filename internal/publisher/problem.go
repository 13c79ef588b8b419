package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
)

// problemBase prefixes every problem type URI.
const problemBase = "https://genbox.dev/problems/"

// Problem type slugs.
const (
	probInvalid      = "invalid-request"
	probUnauth       = "unauthenticated"
	probForbidden    = "forbidden"
	probNotFound     = "not-found"
	probNoRoute      = "no-route"
	probMethod       = "method-not-allowed"
	probConflict     = "conflict"
	probTooLarge     = "body-too-large"
	probMedia        = "unsupported-media-type"
	probIdemMismatch = "idempotency-key-reused"
	// probCallbackRefused: a well-formed callback URL whose destination the SSRF policy forbids.
	probCallbackRefused = "callback-url-refused"
	probRateLimited     = "rate-limited"
	probUnavailable     = "unavailable"
	probInternal        = "internal"
)

// problem builds a problem of the slug's type; fields name the refused request fields.
func problem(httpStatus int, slug, detail string, fields ...client.FieldError) *client.Problem {
	return &client.Problem{Type: problemBase + slug, Title: http.StatusText(httpStatus), Status: httpStatus, Detail: detail, Errors: fields}
}

// fieldProblem is a 400 naming one field.
func fieldProblem(field, format string, args ...any) *client.Problem {
	d := fmt.Sprintf(format, args...)
	return problem(http.StatusBadRequest, probInvalid, field+": "+d, client.FieldError{Field: field, Detail: d})
}

// problemFor is the one mapping from an error to what the API answers.
func problemFor(err error) *client.Problem {
	var p *client.Problem
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &mbe):
		return problem(http.StatusRequestEntityTooLarge, probTooLarge, fmt.Sprintf("the body exceeds %d bytes", mbe.Limit))
	case errors.Is(err, store.ErrNotFound):
		return problem(http.StatusNotFound, probNotFound, "no such resource")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), status.Code(err) == codes.Unavailable,
		status.Code(err) == codes.DeadlineExceeded, status.Code(err) == codes.Aborted:
		p := problem(http.StatusServiceUnavailable, probUnavailable, "the store is unavailable; retry")
		p.RetryAfter = time.Second
		return p
	}
	return problem(http.StatusInternalServerError, probInternal, "internal error")
}

// writeError answers err as problem+json; it logs what the client cannot fix.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	if p.Status >= 500 {
		s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "status", p.Status, "error", err)
	}
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.RetryAfter+time.Second-1)/time.Second)))
	}
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="genbox"`)
	}
	writeJSON(w, p.Status, client.ProblemContentType, p)
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, httpStatus int, contentType string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		httpStatus, b = http.StatusInternalServerError, []byte(`{"title":"Internal Server Error","status":500}`)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(httpStatus)
	_, _ = w.Write(append(b, '\n'))
}
