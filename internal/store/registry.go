package store

// Order is an index field's order.
type Order string

// Index orders.
const (
	Asc  Order = "ASCENDING"
	Desc Order = "DESCENDING"
)

// IndexField is one field of a query's index.
type IndexField struct {
	Path  string
	Order Order
}

// Query describes one query the code runs. The emulator never enforces indexes, so every query
// is listed here and infra/terraform is checked against this list: a composite query needs a
// composite index; a single-field query needs its field left indexed (not exempt).
type Query struct {
	Name       string
	Collection string
	Fields     []IndexField
}

// Composite reports whether the query needs a composite index.
func (q Query) Composite() bool { return len(q.Fields) > 1 }

// Exemption is a field whose single-field indexes are disabled: large values nobody queries, and
// timestamps nobody filters on (a monotonically rising indexed value caps writes near 500/s).
type Exemption struct {
	Collection string
	Field      string
}

// Queries is the registry of every query genbox runs.
var Queries = []Query{
	{Name: "sweep", Collection: TasksCollection, Fields: []IndexField{{"due_shard", Asc}, {"due_at", Asc}}},
	{Name: "sweep-strays", Collection: TasksCollection, Fields: []IndexField{{"due_at", Asc}}},
	{Name: "tasks-by-tenant", Collection: TasksCollection, Fields: []IndexField{{"tenant", Asc}, {"created_at", Desc}}},
	{Name: "tasks-by-tenant-state", Collection: TasksCollection, Fields: []IndexField{{"tenant", Asc}, {"state", Asc}, {"created_at", Desc}}},
	{Name: "dead-letters-by-state", Collection: DeadLettersCollection, Fields: []IndexField{{"state", Asc}, {"created_at", Asc}}},
	{Name: "oldest-pending", Collection: TasksCollection, Fields: []IndexField{{"pending_since", Asc}}},
	{Name: "parked", Collection: TasksCollection, Fields: []IndexField{{"state", Asc}}},
	{Name: "open-dead-letters", Collection: DeadLettersCollection, Fields: []IndexField{{"state", Asc}}},
	{Name: "revoked-api-keys", Collection: APIKeysCollection, Fields: []IndexField{{"revoked", Asc}}},
	{Name: "batch-candidates", Collection: TasksCollection, Fields: []IndexField{{"batch_model", Asc}, {"state", Asc}, {"created_at", Asc}}},
	{Name: "open-batch-jobs", Collection: BatchJobsCollection, Fields: []IndexField{{"model", Asc}, {"open", Asc}}},
	{Name: "batch-tasks-in-flight", Collection: BatchJobsCollection, Fields: []IndexField{{"open", Asc}}},
	{Name: "outputs-by-task", Collection: OutputsCollection, Fields: []IndexField{{"task_id", Asc}}},
	{Name: "console-tasks-by-tenant-family", Collection: TasksCollection, Fields: []IndexField{{"tenant", Asc}, {"family", Asc}, {"created_at", Desc}}},
	{Name: "console-tasks-by-tenant-state-family", Collection: TasksCollection, Fields: []IndexField{{"tenant", Asc}, {"state", Asc}, {"family", Asc}, {"created_at", Desc}}},
	{Name: "tasks-by-state", Collection: TasksCollection, Fields: []IndexField{{"state", Asc}}},
	{Name: "dead-letters-by-task", Collection: DeadLettersCollection, Fields: []IndexField{{"task_id", Asc}}},
	{Name: "schedules-due", Collection: SchedulesCollection, Fields: []IndexField{{"next_fire_at", Asc}}},
	{Name: "schedules-by-tenant", Collection: SchedulesCollection, Fields: []IndexField{{"tenant", Asc}}},
	{Name: "running-reruns", Collection: RerunsCollection, Fields: []IndexField{{"state", Asc}}},
	{Name: "tasks-of-rerun", Collection: TasksCollection, Fields: []IndexField{{"rerun", Asc}, {"state", Asc}}},
	{Name: "any-pending", Collection: TasksCollection, Fields: []IndexField{{"due_at", Asc}}},
	{Name: "awaiting-slot", Collection: TasksCollection, Fields: []IndexField{{"tenant", Asc}, {"awaits_slot", Asc}, {"priority", Desc}, {"created_at", Asc}}},
}

// Exemptions lists the single-field index exemptions of docs/architecture.md §2.
var Exemptions = []Exemption{
	{TasksCollection, "input"},
	{TasksCollection, "output"},
	{TasksCollection, "previous"},
	{TasksCollection, "delivery"},
	{TasksCollection, "labels"},
	{TasksCollection, "gen_config"},
	{TasksCollection, "lease"},
	{TasksCollection, "dlq_notices"},
	{TasksCollection, "decision"},
	{TasksCollection, "slack_update"},
	{TasksCollection, "file_erase"},
	{TasksCollection, "updated_at"},
	{TasksCollection, "completed_at"},
	{TasksCollection, "output_at"},
	{TasksCollection, "not_before"},
	{TasksCollection, "nudge_at"},
	{TasksCollection, "run_before"},
	{TasksCollection, "expire_at"},
	{TasksCollection, "created_at"},
	{TasksCollection, "erased_at"},
	{TasksCollection, "attempt_log"},
	{TasksCollection, "trace_id"},
	{PreviewsCollection, "text"},
	{PreviewsCollection, "updated_at"},
	{PreviewsCollection, "expire_at"},
	{ConsoleSessionsCollection, "expire_at"},
	{ConsoleLoginsCollection, "expire_at"},
	{BatchJobsCollection, "members"},
	{BatchJobsCollection, "expire_at"},
	{OutputsCollection, "payload"},
	{OutputsCollection, "expire_at"},
	{SchedulesCollection, "task"},
	{TasksCollection, "files"},
	{UploadsCollection, "expire_at"},
}
