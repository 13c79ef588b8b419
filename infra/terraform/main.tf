data "google_project" "this" {
  project_id = var.project_id
}

locals {
  firestore_location = var.firestore_location == "" ? var.region : var.firestore_location
  image_base         = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"

  # The Pub/Sub service agent: it signs push requests and moves poison messages to dead-letter
  # topics. google_project_service_identity would name it too, but only in the google-beta
  # provider; its address is fixed by the project number.
  pubsub_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  apis = toset(concat([
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudkms.googleapis.com",
    "cloudtrace.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "telemetry.googleapis.com",
    ], var.gemini_backend == "vertex" ? ["aiplatform.googleapis.com"] : ["generativelanguage.googleapis.com"]
  ))
}

resource "google_project_service" "required" {
  for_each = local.apis

  project = var.project_id
  service = each.value
  # Turning an API off on destroy would break whatever else in the project uses it.
  disable_on_destroy = false
}

resource "google_artifact_registry_repository" "images" {
  project       = var.project_id
  location      = var.region
  repository_id = var.artifact_repository
  description   = "genbox service images, tagged with the commit they were built from"
  format        = "DOCKER"

  docker_config {
    # A tag names one build forever: a deploy of $SHORT_SHA always runs that commit.
    immutable_tags = true
  }

  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 20
    }
  }

  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      older_than = "2592000s"
    }
  }

  depends_on = [google_project_service.required]
}
