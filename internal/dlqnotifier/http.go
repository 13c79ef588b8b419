package dlqnotifier

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
)

// Handler returns the service's HTTP routes: POST /slack/interactions, the admin path under
// /admin/dead-letters (Bearer GENBOX_ADMIN_KEY) and POST /pubsub/push (all three subscriptions
// push here; messages say what they are; the push OIDC token is verified when configured).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+InteractionsPath, s.interactions)
	// The service is public: Cloud Run checks no token, so the push route checks it itself.
	push := bus.Push(s, s.log)
	if auth := s.cfg.PushAuth(); auth.Enabled() {
		push = bus.VerifyPush(push, auth, s.log)
	} else if s.cfg.Consumer == ConsumerPush {
		s.log.Warn("dlqnotifier: push requests are not authenticated (" + EnvPushAudience + " and " + EnvPushAccount + " unset)")
	}
	mux.Handle("POST "+PushPath, push)
	mux.Handle("GET "+AdminPrefix, s.admin(s.list))
	mux.Handle("GET "+AdminPrefix+"/{id}", s.admin(s.show))
	mux.Handle("POST "+AdminPrefix+"/{op}", s.admin(s.decideAdmin))
	return mux
}

// interactions answers a Slack interaction: the signature is verified before anything is parsed,
// only approvers may act, and the decision commits before the answer.
func (s *Service) interactions(w http.ResponseWriter, r *http.Request) {
	if s.throttled(w, r) {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxInteractionBytes))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	if err := verifySlack(r.Header, body, s.cfg.SigningSecret); err != nil {
		s.authFails.Failed(r)
		s.log.WarnContext(r.Context(), "dlqnotifier: interaction refused: bad signature", "error", err)
		writeError(w, http.StatusUnauthorized, "invalid Slack signature")
		return
	}
	cb, err := DecodeInteraction(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
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
	case errors.Is(err, ErrMovedOn), errors.Is(err, ErrAction), errors.Is(err, store.ErrBadDeadLetterID), errors.Is(err, store.ErrNotFound):
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

// admin authenticates the admin path with the Bearer GENBOX_ADMIN_KEY; without a key it is off.
func (s *Service) admin(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.throttled(w, r) {
			return
		}
		key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if s.cfg.AdminKey == "" || !ok || subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.AdminKey)) != 1 {
			s.authFails.Failed(r)
			w.Header().Set("WWW-Authenticate", `Bearer realm="genbox-admin"`)
			writeError(w, http.StatusUnauthorized, "admin key required")
			return
		}
		next(w, r)
	})
}

// throttled answers 429 to a client whose credentials (admin key, Slack signature) failed too
// often lately, before its next attempt is read or checked, and reports whether it did.
func (s *Service) throttled(w http.ResponseWriter, r *http.Request) bool {
	wait := s.authFails.Wait(r)
	if wait <= 0 {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
	writeError(w, http.StatusTooManyRequests, "too many failed authentications from this client; retry later")
	return true
}

// list is GET /admin/dead-letters?state=open&limit=N, oldest first.
func (s *Service) list(w http.ResponseWriter, r *http.Request) {
	state := store.DeadLetterState(r.URL.Query().Get("state"))
	if state == "" {
		state = store.DeadLetterOpen
	}
	limit := 100
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, "limit must be 1..1000")
			return
		}
		limit = n
	}
	out, err := s.store.ListDeadLetters(r.Context(), state, limit)
	if err != nil {
		writeErr(w, err)
		return
	}
	if out == nil {
		out = []*store.DeadLetter{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": out})
}

// show is GET /admin/dead-letters/{id}.
func (s *Service) show(w http.ResponseWriter, r *http.Request) {
	d, err := s.store.GetDeadLetter(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// AdminDecision is the body of POST /admin/dead-letters/{id}:{action}.
type AdminDecision struct {
	Operator string `json:"operator"`
}

// decideAdmin is POST /admin/dead-letters/{id}:redeliver|:regenerate|:discard, through the same
// decision as a Slack click.
func (s *Service) decideAdmin(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	i := strings.LastIndexByte(op, ':')
	if i < 0 {
		writeError(w, http.StatusNotFound, "POST "+AdminPrefix+"/{id}:{redeliver|regenerate|discard}")
		return
	}
	id, action := op[:i], Action(op[i+1:])
	var body AdminDecision
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&body); err != nil || strings.TrimSpace(body.Operator) == "" {
		writeError(w, http.StatusBadRequest, `body must be {"operator": "<who decides>"}`)
		return
	}
	d, err := s.Decide(r.Context(), id, action, strings.TrimSpace(body.Operator)+" (admin)")
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// writeErr maps the service's errors to HTTP statuses, in this one place.
func writeErr(w http.ResponseWriter, err error) {
	var decided *DecidedError
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.As(err, &decided), errors.Is(err, ErrMovedOn):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, ErrAction), errors.Is(err, store.ErrBadDeadLetterID):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "internal error")
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
