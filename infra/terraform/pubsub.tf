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

# Every subscription of bus.Subscriptions: the topic it reads, the topic it dead-letters to (null:
# no dead-letter policy) and the Cloud Run service it is pushed to (null: streaming pull).
#   - gemini-tasks-worker: streaming pull; the client extends the ack deadline while a generation
#     runs.
#   - gemini-results-resulthandler: OIDC-authenticated push to its private Cloud Run service.
#   - the dlqnotifier's three: the two dead-letter topics and the alerts topic, pushed with an OIDC
#     token that the app itself verifies (its service is public so that Slack can reach it). No
#     dead-letter policy: there is nowhere further to send what the last consumer cannot take.
locals {
  subscriptions = {
    "gemini-tasks-worker"            = { topic = "gemini-tasks", dead_letter_topic = "gemini-tasks-dlq", push_to = null }
    "gemini-results-resulthandler"   = { topic = "gemini-results", dead_letter_topic = "gemini-results-dlq", push_to = "resulthandler" }
    "gemini-tasks-dlq-dlqnotifier"   = { topic = "gemini-tasks-dlq", dead_letter_topic = null, push_to = "dlqnotifier" }
    "gemini-results-dlq-dlqnotifier" = { topic = "gemini-results-dlq", dead_letter_topic = null, push_to = "dlqnotifier" }
    "genbox-alerts-dlqnotifier"      = { topic = "genbox-alerts", dead_letter_topic = null, push_to = "dlqnotifier" }
  }
}

resource "google_pubsub_subscription" "subscriptions" {
  for_each = local.subscriptions

  project = var.project_id
  name    = each.key
  topic   = google_pubsub_topic.topics[each.value.topic].id

  ack_deadline_seconds = local.ack_deadline_seconds

  retry_policy {
    minimum_backoff = local.min_backoff
    maximum_backoff = local.max_backoff
  }

  dynamic "dead_letter_policy" {
    for_each = each.value.dead_letter_topic == null ? [] : [each.value.dead_letter_topic]
    content {
      dead_letter_topic     = google_pubsub_topic.topics[dead_letter_policy.value].id
      max_delivery_attempts = local.max_delivery_attempts
    }
  }

  dynamic "push_config" {
    for_each = each.value.push_to == null ? [] : [each.value.push_to]
    content {
      push_endpoint = "${google_cloud_run_v2_service.http[push_config.value].uri}${local.push_path}"
      oidc_token {
        service_account_email = google_service_account.push.email
        audience              = local.push_audience[push_config.value]
      }
    }
  }

  expiration_policy {
    ttl = "" # never expire, however quiet the system is
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

resource "google_pubsub_subscription_iam_member" "agent_acks" {
  for_each = { for name, sub in local.subscriptions : name => sub if sub.dead_letter_topic != null }

  project      = var.project_id
  subscription = google_pubsub_subscription.subscriptions[each.key].name
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

# Addresses before the subscriptions and the agent's grants became one for_each each: a deployment
# made before keeps its subscriptions (and their backlog) instead of replacing them.
moved {
  from = google_pubsub_subscription.worker
  to   = google_pubsub_subscription.subscriptions["gemini-tasks-worker"]
}

moved {
  from = google_pubsub_subscription.resulthandler
  to   = google_pubsub_subscription.subscriptions["gemini-results-resulthandler"]
}

moved {
  from = google_pubsub_subscription.dlqnotifier["gemini-tasks-dlq-dlqnotifier"]
  to   = google_pubsub_subscription.subscriptions["gemini-tasks-dlq-dlqnotifier"]
}

moved {
  from = google_pubsub_subscription.dlqnotifier["gemini-results-dlq-dlqnotifier"]
  to   = google_pubsub_subscription.subscriptions["gemini-results-dlq-dlqnotifier"]
}

moved {
  from = google_pubsub_subscription.dlqnotifier["genbox-alerts-dlqnotifier"]
  to   = google_pubsub_subscription.subscriptions["genbox-alerts-dlqnotifier"]
}

moved {
  from = google_pubsub_subscription_iam_member.agent_acks_worker
  to   = google_pubsub_subscription_iam_member.agent_acks["gemini-tasks-worker"]
}

moved {
  from = google_pubsub_subscription_iam_member.agent_acks_resulthandler
  to   = google_pubsub_subscription_iam_member.agent_acks["gemini-results-resulthandler"]
}
