package publisher

import (
	"errors"
	"fmt"
	"net/http"

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

// problemFor is the one mapping from an error to what the API answers (httpapi.ProblemFor, with
// the publisher's own errors).
func problemFor(err error) *task.Problem {
	return httpapi.ProblemFor(err, func(err error) *task.Problem {
		if errors.Is(err, store.ErrNotFound) {
			return httpapi.Problem(http.StatusNotFound, httpapi.TypeNotFound, "no such resource")
		}
		return nil
	})
}

// writeError answers err as problem+json; it logs what the client cannot fix.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="genbox"`)
	}
	httpapi.Error(w, r, s.log, p, err)
}
