output "publisher_url" {
  description = "Base URL of the REST API that apps call."
  value       = google_cloud_run_v2_service.http["publisher"].uri
}

output "slack_interactions_url" {
  description = "Request URL to enter in the Slack app's Interactivity settings."
  value       = "${google_cloud_run_v2_service.http["dlqnotifier"].uri}/slack/interactions"
}

output "dlqnotifier_url" {
  description = "Base URL of the dlqnotifier (admin routes for `genbox dlq`)."
  value       = google_cloud_run_v2_service.http["dlqnotifier"].uri
}

output "image_repository" {
  description = "Artifact Registry path the Cloud Build pipeline pushes the service images to."
  value       = local.image_base
}

output "service_accounts" {
  description = "Service account of each service."
  value       = { for svc, sa in google_service_account.service : svc => sa.email }
}
