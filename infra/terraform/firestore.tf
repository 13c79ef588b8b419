# The (default) database, the composite indexes of every query in internal/store.Queries, the
# single-field exemptions of store.Exemptions and the TTL policies on expire_at.
# internal/deploycheck fails when this file and the registry disagree: the emulator never
# enforces indexes, so a missing one would fail only in production.

resource "google_firestore_database" "default" {
  project     = var.project_id
  name        = "(default)"
  location_id = local.firestore_location
  type        = "FIRESTORE_NATIVE"
  # Claims and leases are contended transactions; pessimistic locking is what the emulator
  # (and every test) exercises.
  concurrency_mode                  = "PESSIMISTIC"
  point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"
  delete_protection_state           = var.deletion_protection ? "DELETE_PROTECTION_ENABLED" : "DELETE_PROTECTION_DISABLED"

  depends_on = [google_project_service.required]
}

# store.Queries "sweep": a sweep shard's due documents, oldest due first (docs/architecture.md §4,
# the sweeper). due_shard leads the index so its writes spread over GENBOX_SWEEP_SHARDS ranges
# instead of all landing at the near-now end of one (docs/capacity.md).
resource "google_firestore_index" "sweep" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "tasks"

  fields {
    field_path = "due_shard"
    order      = "ASCENDING"
  }
  fields {
    field_path = "due_at"
    order      = "ASCENDING"
  }
}

# store.Queries "tasks-by-tenant": GET /v1/tasks, newest first.
resource "google_firestore_index" "tasks_by_tenant" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "tasks"

  fields {
    field_path = "tenant"
    order      = "ASCENDING"
  }
  fields {
    field_path = "created_at"
    order      = "DESCENDING"
  }
}

# store.Queries "tasks-by-tenant-state": GET /v1/tasks?state=..., newest first.
resource "google_firestore_index" "tasks_by_tenant_state" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "tasks"

  fields {
    field_path = "tenant"
    order      = "ASCENDING"
  }
  fields {
    field_path = "state"
    order      = "ASCENDING"
  }
  fields {
    field_path = "created_at"
    order      = "DESCENDING"
  }
}

# store.Queries "dead-letters-by-state": open dead letters, oldest first (`genbox dlq list`, the
# open-dead-letters gauge).
resource "google_firestore_index" "dead_letters_by_state" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "dead_letters"

  fields {
    field_path = "state"
    order      = "ASCENDING"
  }
  fields {
    field_path = "created_at"
    order      = "ASCENDING"
  }
}

# store.Queries "batch-candidates": the tasks waiting for a batch of a model, oldest first (the
# batcher's gathering).
resource "google_firestore_index" "batch_candidates" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "tasks"

  fields {
    field_path = "batch_model"
    order      = "ASCENDING"
  }
  fields {
    field_path = "state"
    order      = "ASCENDING"
  }
  fields {
    field_path = "created_at"
    order      = "ASCENDING"
  }
}

# store.Queries "open-batch-jobs": a model's batch jobs not yet done (the batcher's polling and
# recovery after a crash).
resource "google_firestore_index" "open_batch_jobs" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "batch_jobs"

  fields {
    field_path = "model"
    order      = "ASCENDING"
  }
  fields {
    field_path = "open"
    order      = "ASCENDING"
  }
}

# store.Queries "console-tasks-by-tenant-family": the console's task search by family.
resource "google_firestore_index" "console_tasks_by_tenant_family" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "tasks"

  fields {
    field_path = "tenant"
    order      = "ASCENDING"
  }
  fields {
    field_path = "family"
    order      = "ASCENDING"
  }
  fields {
    field_path = "created_at"
    order      = "DESCENDING"
  }
}

# store.Queries "console-tasks-by-tenant-state-family": the console's task search by state and
# family.
resource "google_firestore_index" "console_tasks_by_tenant_state_family" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "tasks"

  fields {
    field_path = "tenant"
    order      = "ASCENDING"
  }
  fields {
    field_path = "state"
    order      = "ASCENDING"
  }
  fields {
    field_path = "family"
    order      = "ASCENDING"
  }
  fields {
    field_path = "created_at"
    order      = "DESCENDING"
  }
}

locals {
  # store.Exemptions: large values nobody queries, and timestamps nobody filters on (a
  # monotonically rising indexed value caps a collection near 500 writes/s).
  index_exemptions = {
    "tasks.input"        = { collection = "tasks", field = "input" }
    "tasks.output"       = { collection = "tasks", field = "output" }
    "tasks.previous"     = { collection = "tasks", field = "previous" }
    "tasks.delivery"     = { collection = "tasks", field = "delivery" }
    "tasks.labels"       = { collection = "tasks", field = "labels" }
    "tasks.gen_config"   = { collection = "tasks", field = "gen_config" }
    "tasks.lease"        = { collection = "tasks", field = "lease" }
    "tasks.dlq_notices"  = { collection = "tasks", field = "dlq_notices" }
    "tasks.decision"     = { collection = "tasks", field = "decision" }
    "tasks.slack_update" = { collection = "tasks", field = "slack_update" }
    "tasks.updated_at"   = { collection = "tasks", field = "updated_at" }
    "tasks.completed_at" = { collection = "tasks", field = "completed_at" }
    "tasks.output_at"    = { collection = "tasks", field = "output_at" }
    "tasks.not_before"   = { collection = "tasks", field = "not_before" }
    "tasks.nudge_at"     = { collection = "tasks", field = "nudge_at" }
    "tasks.run_before"   = { collection = "tasks", field = "run_before" }
    "tasks.created_at"   = { collection = "tasks", field = "created_at" }
    "tasks.erased_at"    = { collection = "tasks", field = "erased_at" }
    "outputs.payload"    = { collection = "outputs", field = "payload" }
    "batch_jobs.members" = { collection = "batch_jobs", field = "members" }

    # The attempt log and trace id are read with their task only; a preview's text and time
    # are read by its document's listener only.
    "tasks.attempt_log"   = { collection = "tasks", field = "attempt_log" }
    "tasks.trace_id"      = { collection = "tasks", field = "trace_id" }
    "previews.text"       = { collection = "previews", field = "text" }
    "previews.updated_at" = { collection = "previews", field = "updated_at" }
  }

  # TTL policies. expire_at is also exempt from indexing (store.Exemptions): a field carries one
  # google_firestore_field, so both settings live in the TTL resource.
  ttl_fields = {
    "tasks.expire_at"      = { collection = "tasks", field = "expire_at" }
    "outputs.expire_at"    = { collection = "outputs", field = "expire_at" }
    "batch_jobs.expire_at" = { collection = "batch_jobs", field = "expire_at" }
    "previews.expire_at"   = { collection = "previews", field = "expire_at" }

    "console_sessions.expire_at" = { collection = "console_sessions", field = "expire_at" }
    "console_logins.expire_at"   = { collection = "console_logins", field = "expire_at" }
  }
}

resource "google_firestore_field" "exempt" {
  for_each = local.index_exemptions

  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = each.value.collection
  field      = each.value.field

  # An empty index_config removes every single-field index of the field.
  index_config {}
}

resource "google_firestore_field" "ttl" {
  for_each = local.ttl_fields

  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = each.value.collection
  field      = each.value.field

  # Firestore deletes a document some time (typically within a day) after its expire_at
  # passes; store.Finalize sets expire_at only when nothing is pending and no dead letter is open.
  ttl_config {}

  index_config {}
}
