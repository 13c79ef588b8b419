# Topics and subscriptions exactly as internal/bus declares them (bus.Topics, bus.Subscriptions,
# bus.DefaultTopology); internal/deploycheck fails when the two disagree.

locals {
  topics = toset([
    "gemini-tasks",
    "gemini-results",
    "gemini-tasks-dlq",
    "gemini-results-dlq",
    "genbox-alerts",
  ])

  # bus.DefaultTopology.
  ack_deadline_seconds  = 60
  max_delivery_attempts = 10
  min_backoff           = "10s"
  max_backoff           = "600s"

  # Push endpoints: the path the services mount bus.Push on.
  push_path = "/pubsub/push"
}

resource "google_pubsub_topic" "topics" {
  for_each = local.topics

  project = var.project_id
  name    = each.value
  # A nudge older than a day is worthless: the sweeper has re-sent it long before.
  message_retention_duration = "86400s"

  depends_on = [google_project_service.required]
}

# Worker: streaming pull; the client extends the ack deadline while a generation runs.
resource "google_pubsub_subscription" "worker" {
  project = var.project_id
  name    = "gemini-tasks-worker"
  topic   = google_pubsub_topic.topics["gemini-tasks"].id

  ack_deadline_seconds = local.ack_deadline_seconds

  retry_policy {
    minimum_backoff = local.min_backoff
    maximum_backoff = local.max_backoff
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.topics["gemini-tasks-dlq"].id
    max_delivery_attempts = local.max_delivery_attempts
  }

  expiration_policy {
    ttl = "" # never expire, however quiet the system is
  }
}

# Resulthandler: OIDC-authenticated push to its private Cloud Run service.
resource "google_pubsub_subscription" "resulthandler" {
  project = var.project_id
  name    = "gemini-results-resulthandler"
  topic   = google_pubsub_topic.topics["gemini-results"].id

  ack_deadline_seconds = local.ack_deadline_seconds

  retry_policy {
    minimum_backoff = local.min_backoff
    maximum_backoff = local.max_backoff
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.topics["gemini-results-dlq"].id
    max_delivery_attempts = local.max_delivery_attempts
  }

  push_config {
    push_endpoint = "${google_cloud_run_v2_service.http["resulthandler"].uri}${local.push_path}"
    oidc_token {
      service_account_email = google_service_account.push.email
      audience              = local.push_audience.resulthandler
    }
  }

  expiration_policy {
    ttl = ""
  }
}

# Dlqnotifier: the two dead-letter topics and the alerts topic, pushed with an OIDC token that
# the app itself verifies (its service is public so that Slack can reach it). No dead-letter
# policy: there is nowhere further to send what the last consumer cannot take.
resource "google_pubsub_subscription" "dlqnotifier" {
  for_each = {
    "gemini-tasks-dlq-dlqnotifier"   = "gemini-tasks-dlq"
    "gemini-results-dlq-dlqnotifier" = "gemini-results-dlq"
    "genbox-alerts-dlqnotifier"      = "genbox-alerts"
  }

  project = var.project_id
  name    = each.key
  topic   = google_pubsub_topic.topics[each.value].id

  ack_deadline_seconds = local.ack_deadline_seconds

  retry_policy {
    minimum_backoff = local.min_backoff
    maximum_backoff = local.max_backoff
  }

  push_config {
    push_endpoint = "${google_cloud_run_v2_service.http["dlqnotifier"].uri}${local.push_path}"
    oidc_token {
      service_account_email = google_service_account.push.email
      audience              = local.push_audience.dlqnotifier
    }
  }

  expiration_policy {
    ttl = ""
  }
}

# Without these two grants a dead-letter policy silently does nothing: the Pub/Sub service agent
# must be able to publish to the dead-letter topic and to ack on the source subscription.
resource "google_pubsub_topic_iam_member" "agent_publishes_dead_letters" {
  for_each = toset(["gemini-tasks-dlq", "gemini-results-dlq"])

  project = var.project_id
  topic   = google_pubsub_topic.topics[each.value].name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_agent

  # The agent exists once the Pub/Sub API is enabled.
  depends_on = [google_project_service.required]
}

resource "google_pubsub_subscription_iam_member" "agent_acks_worker" {
  project      = var.project_id
  subscription = google_pubsub_subscription.worker.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
  depends_on   = [google_project_service.required]
}

resource "google_pubsub_subscription_iam_member" "agent_acks_resulthandler" {
  project      = var.project_id
  subscription = google_pubsub_subscription.resulthandler.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
  depends_on   = [google_project_service.required]
}

# The agent mints the push requests' OIDC tokens as the push service account.
resource "google_service_account_iam_member" "agent_signs_push_tokens" {
  service_account_id = google_service_account.push.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_agent
  depends_on         = [google_project_service.required]
}
