# One service account per service, holding only the roles that service uses. Firestore has no
# per-collection IAM, so datastore.user is project-wide; everything else is granted on the one
# topic, subscription or secret concerned.

locals {
  services = toset(["publisher", "worker", "resulthandler", "dlqnotifier"])

  # Topics each service publishes to. The worker also runs the sweeper, which re-sends every
  # kind of nudge (tasks, deliveries, DLQ notices, alerts).
  publishes = {
    publisher     = ["gemini-tasks"]
    worker        = ["gemini-tasks", "gemini-results", "gemini-tasks-dlq", "gemini-results-dlq", "genbox-alerts"]
    resulthandler = ["gemini-results-dlq", "genbox-alerts"]
    dlqnotifier   = ["gemini-tasks", "gemini-results"]
  }
  publisher_grants = merge([
    for svc, topics in local.publishes : { for t in topics : "${svc}/${t}" => { svc = svc, topic = t } }
  ]...)

  # Secrets each service reads.
  reads_secrets = {
    publisher     = ["admin_key"]
    worker        = var.gemini_backend == "gemini" ? ["gemini_api_key"] : []
    resulthandler = []
    dlqnotifier   = ["admin_key", "slack_bot_token", "slack_signing_secret"]
  }
  secret_grants = merge([
    for svc, keys in local.reads_secrets : { for k in keys : "${svc}/${k}" => { svc = svc, secret = k } }
  ]...)

  # Project roles every service needs: Firestore, and OTLP export to telemetry.googleapis.com.
  project_roles = ["roles/datastore.user", "roles/telemetry.tracesWriter", "roles/telemetry.metricsWriter"]
  project_grants = merge(
    { for pair in setproduct(local.services, local.project_roles) : "${pair[0]}/${pair[1]}" => { svc = pair[0], role = pair[1] } },
    var.gemini_backend == "vertex" ? { "worker/roles/aiplatform.user" = { svc = "worker", role = "roles/aiplatform.user" } } : {},
  )
}

resource "google_service_account" "service" {
  for_each = local.services

  project      = var.project_id
  account_id   = "genbox-${each.key}"
  display_name = "genbox ${each.key}"
  description  = "Runs the genbox ${each.key} on Cloud Run."
}

# The identity Pub/Sub push requests carry (OIDC token), allowed to invoke the push consumers.
resource "google_service_account" "push" {
  project      = var.project_id
  account_id   = "genbox-push"
  display_name = "genbox Pub/Sub push"
  description  = "Signs the OIDC tokens of Pub/Sub push requests to the resulthandler and the dlqnotifier."
}

resource "google_project_iam_member" "service" {
  for_each = local.project_grants

  project = var.project_id
  role    = each.value.role
  member  = google_service_account.service[each.value.svc].member
}

resource "google_pubsub_topic_iam_member" "publish" {
  for_each = local.publisher_grants

  project = var.project_id
  topic   = google_pubsub_topic.topics[each.value.topic].name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.service[each.value.svc].member
}

resource "google_pubsub_subscription_iam_member" "worker_pulls" {
  project      = var.project_id
  subscription = google_pubsub_subscription.subscriptions["gemini-tasks-worker"].name
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.service["worker"].member
}

resource "google_secret_manager_secret_iam_member" "reads" {
  for_each = local.secret_grants

  project   = var.project_id
  secret_id = google_secret_manager_secret.secrets[each.value.secret].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.service[each.value.svc].member
}

# The identity of the check builds (cloudbuild.check.yaml, run by the genbox-check trigger): they
# run the tests and every dependency those pull, so it may write its build logs and nothing else.
# The deploy pipeline runs as the deployer and only waits for the check build of its commit.
# Created by hand before the first build (README "Deploy", step 3), then managed here.
import {
  to = google_service_account.ci_tests
  id = "projects/${var.project_id}/serviceAccounts/genbox-ci-tests@${var.project_id}.iam.gserviceaccount.com"
}

resource "google_service_account" "ci_tests" {
  project      = var.project_id
  account_id   = "genbox-ci-tests"
  display_name = "genbox CI tests"
  description  = "Runs genbox's check builds (the tests); holds no role but writing their logs."
}

resource "google_project_iam_member" "ci_tests_logs" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = google_service_account.ci_tests.member
}

# The autoscaler's permission (internal/autoscale): read the worker pool and set its instance
# count, on that pool only. A custom role of exactly run.workerpools.get and .update, rather than
# roles/run.developer (which also creates, deletes and reconfigures every Cloud Run service and
# job it is granted on). The worker's controller sizes the pool; the publisher and the
# dlqnotifier wake it at zero when they nudge a task.
resource "google_project_iam_custom_role" "worker_pool_scaler" {
  project     = var.project_id
  role_id     = "genboxWorkerPoolScaler"
  title       = "genbox worker pool scaler"
  description = "Reads a Cloud Run worker pool and sets its manual instance count."
  permissions = ["run.workerpools.get", "run.workerpools.update"]
}

resource "google_cloud_run_v2_worker_pool_iam_member" "scaler" {
  for_each = toset(["worker", "publisher", "dlqnotifier"])

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_worker_pool.worker.name
  role     = google_project_iam_custom_role.worker_pool_scaler.id
  member   = google_service_account.service[each.key].member
}
