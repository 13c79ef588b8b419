package store

import (
	"context"
	"errors"
	"fmt"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"

	"github.com/genbox-dev/genbox/pkg/task"
)

// CountStates counts the tasks in each of states (query "tasks-by-state": a count aggregation
// per state, reading no documents).
func (s *Store) CountStates(ctx context.Context, states ...task.State) (map[task.State]int64, error) {
	out := make(map[task.State]int64, len(states))
	for _, st := range states {
		q := s.Tasks().Where("state", "==", string(st))
		res, err := q.NewAggregationQuery().WithCount("n").Get(ctx)
		if err != nil {
			return nil, fmt.Errorf("count %s tasks: %w", st, err)
		}
		out[st] = countOf(res["n"])
	}
	return out, nil
}

// AnyPending reports whether some task document has a due_at — work that is due now or will
// be (query "any-pending": the first document by due_at, reading only its id).
func (s *Store) AnyPending(ctx context.Context) (bool, error) {
	it := s.Tasks().OrderBy("due_at", firestore.Asc).Limit(1).Select().Documents(ctx)
	defer it.Stop()
	_, err := it.Next()
	if errors.Is(err, iterator.Done) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("any pending: %w", err)
	}
	return true, nil
}
