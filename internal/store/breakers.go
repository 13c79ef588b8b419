package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// Breaker is the breakers/{model} document: a model's circuit breaker as the instance that changed
// it last left it, written only when its state changes and only over the generation the change was
// made from. Every worker instance follows these documents (BreakerWatch), so one instance's
// outage, probe and recovery are every instance's, and the sweeper leaves the tasks parked on a
// chain alone until it can take calls again.
type Breaker struct {
	Model string    `firestore:"model"`
	State string    `firestore:"state"`
	Since time.Time `firestore:"since"`
	// RetryAt is when an open breaker lets a probe through, or when the probe of a half-open one
	// is overdue (its instance died) and another may take it over.
	RetryAt    *time.Time `firestore:"retry_at,omitempty"`
	Reason     string     `firestore:"reason,omitempty"`
	Generation int64      `firestore:"generation"`
	UpdatedAt  time.Time  `firestore:"updated_at"`
}

// Status is b as the model client adopts it.
func (b Breaker) Status() gemini.BreakerStatus {
	st := gemini.BreakerStatus{Model: b.Model, State: gemini.BreakerState(b.State), Generation: b.Generation, Since: b.Since}
	if b.RetryAt != nil {
		st.RetryAt = *b.RetryAt
	}
	return st
}

var _ gemini.BreakerStore = (*Store)(nil)

// breakerID is the document id of a model: ids cannot hold "/" (as in "models/x" or a Vertex path).
func breakerID(model string) string { return strings.ReplaceAll(model, "/", "~") }

// SaveBreaker records a breaker state change made from generation ch.Generation-1 (no document:
// generation 0), in a write conditioned on the document read: a change made from an older
// generation, or beaten by a concurrent one, is refused with gemini.ErrBreakerMoved. Two
// instances that both saw a cooldown pass therefore never both probe, and a change delivered
// late never overwrites a newer one.
func (s *Store) SaveBreaker(ctx context.Context, ch gemini.BreakerChange) error {
	ref := s.FS.Collection(BreakersCollection).Doc(breakerID(ch.Model))
	snap, err := ref.Get(ctx)
	exists := status.Code(err) != codes.NotFound
	var stored Breaker
	if exists {
		if err != nil {
			return fmt.Errorf("save breaker %s: %w", ch.Model, err)
		}
		if err := snap.DataTo(&stored); err != nil {
			return fmt.Errorf("save breaker %s: decode: %w", ch.Model, err)
		}
	}
	if stored.Generation != ch.Generation-1 {
		return fmt.Errorf("save breaker %s: generation %d over %d: %w", ch.Model, ch.Generation, stored.Generation, gemini.ErrBreakerMoved)
	}
	b := Breaker{Model: ch.Model, State: string(ch.To), Since: ch.At.UTC(), Reason: ch.Reason, Generation: ch.Generation, UpdatedAt: s.now()}
	var retryAt any = firestore.Delete
	if !ch.RetryAt.IsZero() {
		at := ch.RetryAt.UTC()
		b.RetryAt, retryAt = &at, at
	}
	if exists {
		_, err = ref.Update(ctx, []firestore.Update{
			{Path: "model", Value: b.Model}, {Path: "state", Value: b.State}, {Path: "since", Value: b.Since},
			{Path: "retry_at", Value: retryAt}, {Path: "reason", Value: b.Reason},
			{Path: "generation", Value: b.Generation}, {Path: "updated_at", Value: b.UpdatedAt},
		}, firestore.LastUpdateTime(snap.UpdateTime))
	} else {
		_, err = ref.Create(ctx, b)
	}
	switch status.Code(err) {
	case codes.OK:
		return nil
	case codes.FailedPrecondition, codes.AlreadyExists:
		return fmt.Errorf("save breaker %s: %w", ch.Model, gemini.ErrBreakerMoved)
	}
	return fmt.Errorf("save breaker %s: %w", ch.Model, err)
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
		b, err := decodeBreaker(snap)
		if err != nil {
			return nil, err
		}
		out[b.Model] = b
	}
	return out, nil
}

func decodeBreaker(snap *firestore.DocumentSnapshot) (Breaker, error) {
	var b Breaker
	if err := snap.DataTo(&b); err != nil {
		return Breaker{}, fmt.Errorf("decode breaker %s: %w", snap.Ref.ID, err)
	}
	return b, nil
}

// ChainState says what the breakers of a chain allow the tasks parked on it.
type ChainState struct {
	// Closed: a model of the chain is closed (or never opened): calls flow, release its tasks.
	Closed bool
	// Probe: no model is closed, but one may take a probe now (open past its retry time, or
	// half-open with its probe overdue): release one task, whose call is the probe.
	Probe bool
	// RetryAt, when neither, is the earliest time one of them may take a probe.
	RetryAt time.Time
}

// chainState is the state of a chain of models given their breakers.
func chainState(models []string, bs map[string]Breaker, now time.Time) ChainState {
	if len(models) == 0 {
		return ChainState{Closed: true}
	}
	var st ChainState
	for _, m := range models {
		b, ok := bs[m]
		if !ok || b.State == string(gemini.BreakerClosed) {
			return ChainState{Closed: true}
		}
		if b.RetryAt == nil || !now.Before(*b.RetryAt) {
			st.Probe = true
			continue
		}
		if st.RetryAt.IsZero() || b.RetryAt.Before(st.RetryAt) {
			st.RetryAt = *b.RetryAt
		}
	}
	if st.Probe {
		st.RetryAt = time.Time{}
	}
	return st
}

// ChainState reads the breakers of models and says what they allow at now. An empty chain has no
// breaker to wait for: closed.
func (s *Store) ChainState(ctx context.Context, models []string, now time.Time) (ChainState, error) {
	if len(models) == 0 {
		return ChainState{Closed: true}, nil
	}
	bs, err := s.Breakers(ctx, models)
	if err != nil {
		return ChainState{}, err
	}
	return chainState(models, bs, now), nil
}

// ErrBreakersUnknown means the breaker snapshot listener has not read the breakers yet, or has
// lost them: nothing is known of any chain.
var ErrBreakersUnknown = errors.New("store: breakers not read yet")

// BreakerWatch follows every breakers/{model} document through one snapshot listener: what an
// instance knows of the breakers without a read per call or per pass. Observers hear of each
// change as it is stored (the model client adopts it), and Changed is signalled after each, so
// the sweeper releases a chain's parked tasks as soon as any instance sees it recover.
type BreakerWatch struct {
	store *Store
	log   *slog.Logger
	retry time.Duration

	mu        sync.Mutex
	known     map[string]Breaker
	undecoded map[string]error // by model id: documents this version cannot read
	synced    bool
	changed   chan struct{}
	observers []func(gemini.BreakerStatus)
}

// WatchBreakers returns a BreakerWatch on s that logs to log; Run runs its listener.
func (s *Store) WatchBreakers(log *slog.Logger) *BreakerWatch {
	return &BreakerWatch{store: s, log: log, retry: time.Second, known: map[string]Breaker{}, undecoded: map[string]error{}, changed: make(chan struct{})}
}

// Observe calls f with every breaker document as the listener reads it (each is read again when
// the listener restarts): call it before Run.
func (w *BreakerWatch) Observe(f func(gemini.BreakerStatus)) {
	w.mu.Lock()
	w.observers = append(w.observers, f)
	w.mu.Unlock()
}

// Changed is closed at the next change the listener reads (or when it loses or regains the
// breakers); take it again after it fires.
func (w *BreakerWatch) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// ChainState says what the breakers of models allow at now, as last read; ErrBreakersUnknown
// until the listener has read them, and an error when a document of the chain cannot be decoded.
func (w *BreakerWatch) ChainState(_ context.Context, models []string, now time.Time) (ChainState, error) {
	if len(models) == 0 {
		return ChainState{Closed: true}, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return ChainState{}, ErrBreakersUnknown
	}
	for _, m := range models {
		if err := w.undecoded[breakerID(m)]; err != nil {
			return ChainState{}, err
		}
	}
	return chainState(models, w.known, now), nil
}

// Run listens to the breakers until ctx ends, starting again (after a pause) when the listener
// fails; meanwhile ChainState answers ErrBreakersUnknown.
func (w *BreakerWatch) Run(ctx context.Context) {
	for ctx.Err() == nil {
		err := w.listen(ctx)
		w.update(func() { w.synced = false })
		if ctx.Err() != nil {
			return
		}
		w.log.WarnContext(ctx, "breaker listener stopped; restarting", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(w.retry):
		}
	}
}

func (w *BreakerWatch) listen(ctx context.Context) error {
	it := w.store.FS.Collection(BreakersCollection).Snapshots(ctx)
	defer it.Stop()
	for {
		qs, err := it.Next()
		if err != nil {
			return err
		}
		snaps, err := qs.Documents.GetAll()
		if err != nil {
			return err
		}
		known, undecoded := map[string]Breaker{}, map[string]error{}
		for _, snap := range snaps {
			b, err := decodeBreaker(snap)
			if err != nil {
				undecoded[snap.Ref.ID] = err
				continue
			}
			known[b.Model] = b
		}
		var observers []func(gemini.BreakerStatus)
		w.update(func() {
			w.known, w.undecoded, w.synced = known, undecoded, true
			observers = w.observers
		})
		for _, b := range known {
			for _, f := range observers {
				f(b.Status())
			}
		}
	}
}

// update applies f under the lock and signals Changed.
func (w *BreakerWatch) update(f func()) {
	w.mu.Lock()
	f()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}
