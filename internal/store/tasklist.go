package store

import (
	"context"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Cursor is the position after the last task of a page: tasks are listed newest first, ties
// broken by id.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// viewFields are the fields (*Task).View reads: a listing skips inputs, history and payloads.
var viewFields = []string{"state", "family", "variant", "labels", "output", "output_at", "usage", "cost_usd", "model",
	"degraded", "stale", "cache_hit", "replay", "delivery.state", "delivery.attempts", "error", "created_at", "completed_at"}

// ListTasks returns up to limit of tenant's tasks (only those in state, when state is not empty),
// newest first, starting after the cursor (from the start when nil), and the cursor of the next
// page (nil on the last page). The tasks hold only what View shows. It runs the tasks-by-tenant or
// tasks-by-tenant-state query.
func (s *Store) ListTasks(ctx context.Context, tenant string, state task.State, limit int, after *Cursor) ([]*protocol.Task, *Cursor, error) {
	q := s.Tasks().Where("tenant", "==", tenant)
	if state != "" {
		q = q.Where("state", "==", string(state))
	}
	q = q.OrderBy("created_at", firestore.Desc).OrderBy(firestore.DocumentID, firestore.Desc)
	if after != nil {
		q = q.StartAfter(after.CreatedAt, s.Tasks().Doc(after.ID))
	}
	out, err := readAll(q.Limit(limit+1).Select(viewFields...).Documents(ctx), "list tasks of "+tenant, DecodeTask)
	if err != nil {
		return nil, nil, err
	}
	if len(out) <= limit {
		return out, nil, nil
	}
	out = out[:limit]
	last := out[limit-1]
	return out, &Cursor{CreatedAt: last.CreatedAt, ID: last.ID}, nil
}
