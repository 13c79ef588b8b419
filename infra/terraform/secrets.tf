# Secrets are created here empty; their values are added outside Terraform (docs/deploy.md,
# step 5) so that they never enter the state file:
#   printf %s "$VALUE" | gcloud secrets versions add ID --data-file=-
locals {
  secrets = {
    gemini_api_key       = { id = "genbox-gemini-api-key", env = "GEMINI_API_KEY" }
    admin_key            = { id = "genbox-admin-key", env = "GENBOX_ADMIN_KEY" }
    slack_bot_token      = { id = "genbox-slack-bot-token", env = "SLACK_BOT_TOKEN" }
    slack_signing_secret = { id = "genbox-slack-signing-secret", env = "SLACK_SIGNING_SECRET" }
  }
}

resource "google_secret_manager_secret" "secrets" {
  for_each = local.secrets

  project   = var.project_id
  secret_id = each.value.id

  replication {
    auto {}
  }

  depends_on = [google_project_service.required]
}
