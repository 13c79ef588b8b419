# The input bucket (docs/deploy.md "Files"): what POST /v1/uploads signs uploads into, under
# uploads/{tenant}/{upload_id}. Tasks record the generation they read; genbox erases a task's
# uploads with the task, and the lifecycle rule deletes what nobody erased.

resource "google_project_service" "storage" {
  project            = var.project_id
  service            = "storage.googleapis.com"
  disable_on_destroy = false
}

resource "google_storage_bucket" "input" {
  project  = var.project_id
  name     = var.input_bucket != "" ? var.input_bucket : "${var.project_id}-genbox-input"
  location = var.region
  labels   = var.labels

  # IAM alone decides who reads it; never public.
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = !var.deletion_protection

  # An upload's document (uploads/{id}) lives 8 days (publisher.Config.UploadRetention); its
  # object is deleted a day later at the latest.
  lifecycle_rule {
    condition {
      age = 9
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.storage]
}

# The publisher signs upload URLs, reads what was uploaded and erases it; the worker reads it.
resource "google_storage_bucket_iam_member" "input" {
  for_each = {
    publisher = "roles/storage.objectUser"
    worker    = "roles/storage.objectViewer"
  }

  bucket = google_storage_bucket.input.name
  role   = each.value
  member = google_service_account.service[each.key].member
}

# On Cloud Run there is no private key: the publisher signs URLs through the IAM Credentials
# API (signBlob) as itself, which takes the token creator role on its own account.
resource "google_service_account_iam_member" "publisher_signs" {
  service_account_id = google_service_account.service["publisher"].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = google_service_account.service["publisher"].member
}

# On Vertex AI the model reads gs:// files itself, as the Vertex AI service agent.
resource "google_storage_bucket_iam_member" "vertex_reads_input" {
  count = var.gemini_backend == "vertex" ? 1 : 0

  bucket = google_storage_bucket.input.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-aiplatform.iam.gserviceaccount.com"
}
