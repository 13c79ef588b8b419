package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// Breaker is the breakers/{model} document: the last state change of a model's circuit breaker,
// written only when the state changes. The sweeper reads it to leave parked tasks alone until a
// model of their chain can take calls again.
type Breaker struct {
	Model     string     `firestore:"model"`
	State     string     `firestore:"state"`
	Since     time.Time  `firestore:"since"`
	RetryAt   *time.Time `firestore:"retry_at,omitempty"` // when an open breaker lets a probe through
	Reason    string     `firestore:"reason,omitempty"`
	UpdatedAt time.Time  `firestore:"updated_at"`
}

var _ gemini.BreakerStore = (*Store)(nil)

// breakerID is the document id of a model: ids cannot hold "/" (as in "models/x" or a Vertex path).
func breakerID(model string) string { return strings.ReplaceAll(model, "/", "~") }

// SaveBreaker records a breaker state change.
func (s *Store) SaveBreaker(ctx context.Context, ch gemini.BreakerChange) error {
	b := Breaker{Model: ch.Model, State: string(ch.To), Since: ch.At.UTC(), Reason: ch.Reason, UpdatedAt: s.now()}
	if !ch.RetryAt.IsZero() {
		at := ch.RetryAt.UTC()
		b.RetryAt = &at
	}
	if _, err := s.FS.Collection(BreakersCollection).Doc(breakerID(ch.Model)).Set(ctx, b); err != nil {
		return fmt.Errorf("save breaker %s: %w", ch.Model, err)
	}
	return nil
}

// Breakers reads the breaker documents of models; a model without one has never opened and is
// absent from the result.
func (s *Store) Breakers(ctx context.Context, models []string) (map[string]Breaker, error) {
	refs := make([]*firestore.DocumentRef, len(models))
	for i, m := range models {
		refs[i] = s.FS.Collection(BreakersCollection).Doc(breakerID(m))
	}
	snaps, err := s.FS.GetAll(ctx, refs)
	if err != nil {
		return nil, fmt.Errorf("read breakers: %w", err)
	}
	out := map[string]Breaker{}
	for _, snap := range snaps {
		if !snap.Exists() {
			continue
		}
		var b Breaker
		if err := snap.DataTo(&b); err != nil {
			return nil, fmt.Errorf("decode breaker %s: %w", snap.Ref.ID, err)
		}
		out[b.Model] = b
	}
	return out, nil
}

// ChainAvailable reports whether any model of the chain may take a call at now: its breaker is
// closed, half-open, never opened, or open past its retry time. The sweeper leaves parked tasks
// of a chain that is not available alone. An empty chain has no breaker to wait for: available.
func (s *Store) ChainAvailable(ctx context.Context, models []string, now time.Time) (bool, error) {
	if len(models) == 0 {
		return true, nil
	}
	bs, err := s.Breakers(ctx, models)
	if err != nil {
		return false, err
	}
	for _, m := range models {
		b, ok := bs[m]
		if !ok || b.State != string(gemini.BreakerOpen) || (b.RetryAt != nil && !now.Before(*b.RetryAt)) {
			return true, nil
		}
	}
	return false, nil
}
