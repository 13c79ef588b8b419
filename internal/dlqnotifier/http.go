package dlqnotifier

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Handler returns the service's HTTP routes: POST /slack/interactions, the admin path under
// /admin/dead-letters (Bearer GENBOX_ADMIN_KEY) and POST /pubsub/push (all three subscriptions
// push here; messages say what they are; the push OIDC token is verified, fail closed).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+InteractionsPath, s.interactions)
	// The service is public: Cloud Run checks no token, so the push route checks it itself.
	mux.Handle("POST "+PushPath, bus.PushRoute(s, s.cfg.PushAuth(), s.cfg.UnauthenticatedPush, s.log))
	mux.Handle("GET "+AdminPrefix, s.admin(s.list))
	mux.Handle("GET "+AdminPrefix+"/{id}", s.admin(s.show))
	mux.Handle("POST "+AdminPrefix+"/{op}", s.admin(s.decideAdmin))
	return mux
}

// interactions answers a Slack interaction: the signature is verified before anything is parsed,
// only approvers may act, and the decision commits before the answer. A bad signature is counted
// as a failed credential, and logged while its client's failures are within their limits.
func (s *Service) interactions(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxInteractionBytes))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := verifySlack(r.Header, body, s.cfg.SigningSecret); err != nil {
		if p := httpapi.Failed(s.authFails, r); p != nil {
			s.writeError(w, r, p)
			return
		}
		s.log.WarnContext(r.Context(), "dlqnotifier: interaction refused: bad signature", "error", err)
		s.writeError(w, r, httpapi.Problem(http.StatusUnauthorized, httpapi.TypeUnauth, "invalid Slack signature"))
		return
	}
	cb, err := DecodeInteraction(body)
	if err != nil {
		s.writeError(w, r, httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, err.Error()))
		return
	}
	if cb.Type != slack.InteractionTypeBlockActions || len(cb.ActionCallback.BlockActions) == 0 {
		w.WriteHeader(http.StatusOK) // nothing of ours
		return
	}
	act := cb.ActionCallback.BlockActions[0]
	log := s.log.With("slack_user", cb.User.ID, "dead_letter_id", act.Value, "action", act.ActionID)
	if !s.approvers[cb.User.ID] {
		log.WarnContext(r.Context(), "dlqnotifier: decision refused: not an approver")
		s.ephemeral(r, cb, "Only genbox approvers can decide on dead letters; nothing was changed.")
		w.WriteHeader(http.StatusOK)
		return
	}
	_, err = s.Decide(r.Context(), act.Value, Action(act.ActionID), "<@"+cb.User.ID+">")
	var decided *DecidedError
	switch {
	case err == nil:
	case errors.As(err, &decided):
		s.ephemeral(r, cb, "This dead letter was "+decided.Error()+"; nothing was repeated.")
	case errors.Is(err, ErrMovedOn), errors.Is(err, ErrAction), errors.Is(err, protocol.ErrBadDeadLetterID), errors.Is(err, store.ErrNotFound):
		s.ephemeral(r, cb, "Nothing was changed: "+err.Error())
	default:
		log.ErrorContext(r.Context(), "dlqnotifier: decision failed", "error", err)
		s.ephemeral(r, cb, "The decision could not be recorded; nothing was changed. Try again.")
	}
	w.WriteHeader(http.StatusOK)
}

// ephemeral tells the clicking user something only they see.
func (s *Service) ephemeral(r *http.Request, cb *slack.InteractionCallback, text string) {
	channel := cb.Channel.ID
	if channel == "" {
		channel = s.cfg.Channel
	}
	if _, err := s.slack.PostEphemeralContext(r.Context(), channel, cb.User.ID, slack.MsgOptionText(text, false)); err != nil {
		s.log.WarnContext(r.Context(), "dlqnotifier: ephemeral answer failed", "error", err)
	}
}

// admin authenticates the admin path as the publisher does its admin routes (httpapi.AdminKey:
// Bearer GENBOX_ADMIN_KEY, hashed and compared in constant time); without a key it is off.
func (s *Service) admin(next func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := s.adminKey.Authorize(r, s.authFails); p != nil {
			if p.Status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="genbox-admin"`)
			}
			s.writeError(w, r, p)
			return
		}
		if err := next(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// list is GET /admin/dead-letters?state=open&limit=N, oldest first.
func (s *Service) list(w http.ResponseWriter, r *http.Request) error {
	state := store.DeadLetterState(r.URL.Query().Get("state"))
	if state == "" {
		state = store.DeadLetterOpen
	}
	limit := 100
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "limit must be 1..1000",
				task.FieldError{Field: "limit", Detail: "must be 1..1000"})
		}
		limit = n
	}
	dls, err := s.store.ListDeadLetters(r.Context(), state, limit)
	if err != nil {
		return err
	}
	out := task.DeadLetterList{DeadLetters: make([]task.DeadLetter, 0, len(dls))}
	for _, d := range dls {
		out.DeadLetters = append(out.DeadLetters, deadLetterView(d))
	}
	httpapi.JSON(w, http.StatusOK, "application/json", out)
	return nil
}

// show is GET /admin/dead-letters/{id}.
func (s *Service) show(w http.ResponseWriter, r *http.Request) error {
	d, err := s.store.GetDeadLetter(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	httpapi.JSON(w, http.StatusOK, "application/json", deadLetterView(d))
	return nil
}

// decideAdmin is POST /admin/dead-letters/{id}:redeliver|:regenerate|:discard, through the same
// decision as a Slack click. The decision is recorded as the admin key's (the credential is all
// that was verified); a name the body gives is kept beside it, marked as what it is.
func (s *Service) decideAdmin(w http.ResponseWriter, r *http.Request) error {
	op := r.PathValue("op")
	i := strings.LastIndexByte(op, ':')
	if i < 0 {
		return httpapi.Problem(http.StatusNotFound, httpapi.TypeNoRoute, "POST "+AdminPrefix+"/{id}:{redeliver|regenerate|discard}")
	}
	id, action := op[:i], Action(op[i+1:])
	var body task.DeadLetterDecision
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<10))
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &body); err != nil {
			return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, `the body must be empty or {"operator": "<your name>"}`)
		}
	}
	d, err := s.Decide(r.Context(), id, action, s.adminKey.Says(body.Operator))
	if err != nil {
		return err
	}
	httpapi.JSON(w, http.StatusOK, "application/json", deadLetterView(d))
	return nil
}

// deadLetterView is what the admin routes show of a dead letter: not how its Slack message is
// kept (channel, timestamp, failed posts).
func deadLetterView(d *store.DeadLetter) task.DeadLetter {
	return task.DeadLetter{
		ID: d.ID, TaskID: d.TaskID, Tenant: d.Tenant, Family: d.Family, Variant: d.Variant, Stage: d.Stage,
		Replay: d.Replay, Round: d.Round, State: string(d.State), EventID: d.EventID, EventType: d.EventType,
		Attempts: d.Attempts, LastError: d.LastError, Usage: d.Usage, CostUSD: d.CostUSD,
		DecidedBy: d.DecidedBy, DecidedAt: d.DecidedAt, Applied: d.Applied, CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt,
	}
}

// problemFor is the one mapping from the service's errors to what it answers
// (httpapi.ProblemFor, with the dlqnotifier's own errors).
func problemFor(err error) *task.Problem {
	return httpapi.ProblemFor(err, func(err error) *task.Problem {
		var decided *DecidedError
		switch {
		case errors.Is(err, store.ErrNotFound):
			return httpapi.Problem(http.StatusNotFound, httpapi.TypeNotFound, err.Error())
		case errors.As(err, &decided), errors.Is(err, ErrMovedOn):
			return httpapi.Problem(http.StatusConflict, httpapi.TypeConflict, err.Error())
		case errors.Is(err, ErrAction), errors.Is(err, protocol.ErrBadDeadLetterID):
			return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, err.Error())
		}
		return nil
	})
}

// writeError answers err as problem+json; a 5xx is logged with err.
func (s *Service) writeError(w http.ResponseWriter, r *http.Request, err error) {
	httpapi.Error(w, r, s.log, problemFor(err), err)
}
