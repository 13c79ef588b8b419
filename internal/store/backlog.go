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

// WorkersWillRun reports whether something the workers run in the background is ahead besides
// tasks: a schedule not paused (its next_fire_at is set; query "schedules-due", reading only the
// first id) or a re-run still running. A pool at zero runs no schedule firer and no re-run pacer.
func (s *Store) WorkersWillRun(ctx context.Context) (bool, error) {
	it := s.Schedules().OrderBy("next_fire_at", firestore.Asc).Limit(1).Select().Documents(ctx)
	defer it.Stop()
	_, err := it.Next()
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, iterator.Done) {
		return false, fmt.Errorf("any schedule: %w", err)
	}
	reruns, err := s.RunningReruns(ctx)
	return len(reruns) > 0, err
}
