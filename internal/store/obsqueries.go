package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/task"
)

// pingDoc is the document readiness probes read: it never exists, so a probe costs one read
// and touches no data.
const pingDoc = "readyz-probe"

// Ping reads one document to tell whether Firestore answers: a readiness probe.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.Tasks().Doc(pingDoc).Get(ctx)
	if err == nil || status.Code(err) == codes.NotFound {
		return nil
	}
	return fmt.Errorf("firestore ping: %w", err)
}

// OldestPending returns the pending_since of the task that has waited longest for work to be
// done on it (query "oldest-pending"); ok is false when nothing is pending.
func (s *Store) OldestPending(ctx context.Context) (since time.Time, ok bool, err error) {
	it := s.Tasks().OrderBy("pending_since", firestore.Asc).Limit(1).Select("pending_since").Documents(ctx)
	defer it.Stop()
	snap, err := it.Next()
	if errors.Is(err, iterator.Done) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("oldest pending: %w", err)
	}
	t, err := snap.DataAt("pending_since")
	if err != nil {
		return time.Time{}, false, fmt.Errorf("oldest pending: %w", err)
	}
	at, ok := t.(time.Time)
	return at, ok, nil
}

// MaxOpenDeadLetters bounds the open dead letters OpenDeadLetters reads: a backlog that large
// is reported as this many.
const MaxOpenDeadLetters = 10000

// OpenDeadLetters counts the dead letters awaiting a decision, by stage (query
// "open-dead-letters"), reading only their stage.
func (s *Store) OpenDeadLetters(ctx context.Context) (map[task.Stage]int64, error) {
	q := s.DeadLetters().Where("state", "==", string(DeadLetterOpen)).Limit(MaxOpenDeadLetters).Select("stage")
	stages, err := readAll(q.Documents(ctx), "open dead letters", func(snap *firestore.DocumentSnapshot) (task.Stage, error) {
		st, _ := snap.DataAt("stage")
		s, _ := st.(string)
		return task.Stage(s), nil
	})
	if err != nil {
		return nil, err
	}
	n := map[task.Stage]int64{task.StageGeneration: 0, task.StageDelivery: 0}
	for _, st := range stages {
		if st != "" {
			n[st]++
		}
	}
	return n, nil
}
