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

locals {
  # The composite index of each store.Queries entry that needs one: its collection and its fields
  # in the query's order, keyed by the name it had as a resource of its own.
  composite_indexes = {
    # store.Queries "sweep": a sweep shard's due documents, oldest due first (docs/architecture.md
    # §4, the sweeper). due_shard leads the index so its writes spread over GENBOX_SWEEP_SHARDS
    # ranges instead of all landing at the near-now end of one (docs/capacity.md).
    sweep = {
      collection = "tasks"
      fields = [
        { path = "due_shard", order = "ASCENDING" },
        { path = "due_at", order = "ASCENDING" },
      ]
    }

    # store.Queries "tasks-by-tenant": GET /v1/tasks, newest first.
    tasks_by_tenant = {
      collection = "tasks"
      fields = [
        { path = "tenant", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }

    # store.Queries "tasks-by-tenant-state": GET /v1/tasks?state=..., newest first.
    tasks_by_tenant_state = {
      collection = "tasks"
      fields = [
        { path = "tenant", order = "ASCENDING" },
        { path = "state", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }

    # store.Queries "dead-letters-by-state": open dead letters, oldest first (`genbox dlq list`, the
    # open-dead-letters gauge).
    dead_letters_by_state = {
      collection = "dead_letters"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "created_at", order = "ASCENDING" },
      ]
    }

    # store.Queries "batch-candidates": the tasks waiting for a batch of a model, oldest first (the
    # batcher's gathering).
    batch_candidates = {
      collection = "tasks"
      fields = [
        { path = "batch_model", order = "ASCENDING" },
        { path = "state", order = "ASCENDING" },
        { path = "created_at", order = "ASCENDING" },
      ]
    }

    # store.Queries "awaiting-slot": a tenant's tasks waiting for one of its concurrency slots,
    # highest priority first, then oldest (the worker's slot hand-off).
    awaiting_slot = {
      collection = "tasks"
      fields = [
        { path = "tenant", order = "ASCENDING" },
        { path = "awaits_slot", order = "ASCENDING" },
        { path = "priority", order = "DESCENDING" },
        { path = "created_at", order = "ASCENDING" },
      ]
    }

    # store.Queries "open-batch-jobs": a model's batch jobs not yet done (the batcher's polling and
    # recovery after a crash).
    open_batch_jobs = {
      collection = "batch_jobs"
      fields = [
        { path = "model", order = "ASCENDING" },
        { path = "open", order = "ASCENDING" },
      ]
    }

    # store.Queries "console-tasks-by-tenant-family": the console's task search by family.
    console_tasks_by_tenant_family = {
      collection = "tasks"
      fields = [
        { path = "tenant", order = "ASCENDING" },
        { path = "family", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }

    # store.Queries "console-tasks-by-tenant-state-family": the console's task search by state and
    # family.
    console_tasks_by_tenant_state_family = {
      collection = "tasks"
      fields = [
        { path = "tenant", order = "ASCENDING" },
        { path = "state", order = "ASCENDING" },
        { path = "family", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }

    # store.Queries "tasks-of-rerun": how many of a re-run's tasks have ended, per outcome.
    tasks_of_rerun = {
      collection = "tasks"
      fields = [
        { path = "rerun", order = "ASCENDING" },
        { path = "state", order = "ASCENDING" },
      ]
    }
  }
}

resource "google_firestore_index" "composite" {
  for_each = local.composite_indexes

  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = each.value.collection

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path = fields.value.path
      order      = fields.value.order
    }
  }
}

# The indexes were one resource each before composite: these keep an existing deployment's
# indexes, which take minutes to build, instead of destroying and recreating them.
moved {
  from = google_firestore_index.sweep
  to   = google_firestore_index.composite["sweep"]
}

moved {
  from = google_firestore_index.tasks_by_tenant
  to   = google_firestore_index.composite["tasks_by_tenant"]
}

moved {
  from = google_firestore_index.tasks_by_tenant_state
  to   = google_firestore_index.composite["tasks_by_tenant_state"]
}

moved {
  from = google_firestore_index.dead_letters_by_state
  to   = google_firestore_index.composite["dead_letters_by_state"]
}

moved {
  from = google_firestore_index.batch_candidates
  to   = google_firestore_index.composite["batch_candidates"]
}

moved {
  from = google_firestore_index.open_batch_jobs
  to   = google_firestore_index.composite["open_batch_jobs"]
}

moved {
  from = google_firestore_index.console_tasks_by_tenant_family
  to   = google_firestore_index.composite["console_tasks_by_tenant_family"]
}

moved {
  from = google_firestore_index.console_tasks_by_tenant_state_family
  to   = google_firestore_index.composite["console_tasks_by_tenant_state_family"]
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
    "tasks.file_erase"   = { collection = "tasks", field = "file_erase" }
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

    # The attempt log and trace id are read with their task only; a preview's text and time are read
    # by its document's listener only.
    "tasks.attempt_log"   = { collection = "tasks", field = "attempt_log" }
    "tasks.trace_id"      = { collection = "tasks", field = "trace_id" }
    "previews.text"       = { collection = "previews", field = "text" }
    "previews.updated_at" = { collection = "previews", field = "updated_at" }

    # A schedule's task template is read with its schedule only.
    "schedules.task" = { collection = "schedules", field = "task" }
    # A task's files (objects, generations, checksums, Files API copies) are read with it only.
    "tasks.files" = { collection = "tasks", field = "files" }
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

    # An upload's document lives as long as the input bucket's lifecycle rule keeps its object.
    "uploads.expire_at" = { collection = "uploads", field = "expire_at" }
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
