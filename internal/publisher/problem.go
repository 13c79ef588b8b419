package publisher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The publisher's own problem types, beside httpapi's.
const (
	probIdemMismatch = "idempotency-key-reused"
	// probCallbackRefused: a well-formed callback URL whose destination the SSRF policy forbids.
	probCallbackRefused = "callback-url-refused"
)

// fieldProblem is a 400 naming one field.
func fieldProblem(field, format string, args ...any) *task.Problem {
	d := fmt.Sprintf(format, args...)
	return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, field+": "+d, task.FieldError{Field: field, Detail: d})
}

// problemFor is the one mapping from an error to what the API answers.
func problemFor(err error) *task.Problem {
	var p *task.Problem
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &mbe):
		return httpapi.Problem(http.StatusRequestEntityTooLarge, httpapi.TypeTooLarge, fmt.Sprintf("the body exceeds %d bytes", mbe.Limit))
	case errors.Is(err, store.ErrNotFound):
		return httpapi.Problem(http.StatusNotFound, httpapi.TypeNotFound, "no such resource")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), status.Code(err) == codes.Unavailable,
		status.Code(err) == codes.DeadlineExceeded, status.Code(err) == codes.Aborted:
		p := httpapi.Problem(http.StatusServiceUnavailable, httpapi.TypeUnavailable, "the store is unavailable; retry")
		p.RetryAfter = time.Second
		return p
	}
	return httpapi.Problem(http.StatusInternalServerError, httpapi.TypeInternal, "internal error")
}

// writeError answers err as problem+json; it logs what the client cannot fix.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="genbox"`)
	}
	httpapi.Error(w, r, s.log, p, err)
}
