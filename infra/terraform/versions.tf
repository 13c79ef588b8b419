terraform {
  # 1.5 brought the `check` block and stable `import` blocks; nothing newer is needed.
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.37 added google_cloud_run_v2_worker_pool; stay on the 6.x line the configuration was
      # written against (a major release renames and removes arguments).
      version = "~> 6.50"
    }
  }

  # State lives in a GCS bucket created before the first apply (docs/deploy.md, step 2):
  # terraform init -backend-config=bucket=<state bucket>
  backend "gcs" {
    prefix = "genbox"
  }
}

provider "google" {
  project = var.project_id
  region  = var.region

  default_labels = merge({ app = "genbox" }, var.labels)
}
