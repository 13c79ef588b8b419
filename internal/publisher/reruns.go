package publisher

import (
	"errors"
	"net/http"
	"regexp"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// rerunIDPattern is the shape of a re-run id: it appears in GET /v1/reruns/{id} as it is.
var rerunIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// handleRerun is POST /v1/tasks:rerun: a dry run answers the count and the estimate; otherwise
// the re-run is created (201), or an earlier one of the same id returned (200), for the
// workers' pacer to run.
func (s *Server) handleRerun(w http.ResponseWriter, r *http.Request, tenant string) error {
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	// A request reads every candidate task of the tenant: it takes a submission token.
	if err := s.take(r.Context(), tenant); err != nil {
		return err
	}
	var req task.RerunRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.RerunID != "" && !rerunIDPattern.MatchString(req.RerunID) {
		return fieldProblem("rerun_id", "must be 1 to 64 letters, digits, '_', '.' or '-'")
	}
	if req.RerunID == "" && key != "" {
		req.RerunID = "rr_" + derivedID(tenant, "rerun\x00"+key)
	}
	// A scan of the tenant's tasks may outlast one store call's bound: the request's own
	// deadline applies.
	ctx := r.Context()
	if req.DryRun {
		v, err := s.reruns.DryRun(ctx, tenant, req.Filter)
		if err != nil {
			return rerunProblem(err)
		}
		httpapi.JSON(w, http.StatusOK, "application/json", v)
		return nil
	}
	rr, replayed, err := s.reruns.Start(ctx, tenant, req.RerunID, "tenant "+tenant+" (api)", req.Filter)
	if err != nil {
		return rerunProblem(err)
	}
	v := s.rerunView(r, rr)
	w.Header().Set("Location", v.StatusURL)
	code := http.StatusCreated
	if replayed {
		w.Header().Set(task.HeaderReplayed, "true")
		code = http.StatusOK
	}
	httpapi.JSON(w, code, "application/json", v)
	return nil
}

// handleGetRerun is GET /v1/reruns/{rerun}: a re-run of the caller's tenant with its progress.
func (s *Server) handleGetRerun(w http.ResponseWriter, r *http.Request, tenant string) error {
	id, err := pathID(r, "rerun")
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	rr, err := s.reruns.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	httpapi.JSON(w, http.StatusOK, "application/json", s.rerunView(r, rr))
	return nil
}

func (s *Server) rerunView(r *http.Request, rr *store.Rerun) task.Rerun {
	v := rr.View()
	v.StatusURL = s.baseURL(r) + "/v1/reruns/" + rr.RerunID
	return v
}

// rerunProblem maps the re-run's own errors to problems; others go to problemFor.
func rerunProblem(err error) error {
	var fe *rerun.FieldError
	switch {
	case errors.As(err, &fe):
		return fieldProblem(fe.Field, "%s", fe.Detail)
	case errors.Is(err, rerun.ErrIDReused):
		return httpapi.Problem(http.StatusUnprocessableEntity, probIdemMismatch, "this rerun id was used with a different filter",
			task.FieldError{Field: "rerun_id", Detail: "already used with a different filter"})
	}
	return err
}
