# The key that seals the tenants' webhook signing secrets (internal/secretbox): Firestore keeps
# them as ciphertext, whose data keys only this key unwraps. The publisher, which creates and
# rotates secrets, may only encrypt with it; the resulthandler, which signs deliveries, may only
# decrypt; no other service may do either, though all read Firestore. KMS key versions rotate
# every 90 days without re-sealing (a ciphertext names its version); a key ring and its keys can
# never be deleted, only their versions destroyed, so keep prevent_destroy.

locals {
  kms_key_ring = "genbox"
  kms_key      = "webhook-secrets"
  # The key's resource name, known before apply (the services' loaders check its form).
  webhook_secrets_key = "projects/${var.project_id}/locations/${var.region}/keyRings/${local.kms_key_ring}/cryptoKeys/${local.kms_key}"
}

resource "google_kms_key_ring" "genbox" {
  project  = var.project_id
  name     = local.kms_key_ring
  location = var.region

  depends_on = [google_project_service.required]
}

resource "google_kms_crypto_key" "webhook_secrets" {
  name            = local.kms_key
  key_ring        = google_kms_key_ring.genbox.id
  purpose         = "ENCRYPT_DECRYPT"
  rotation_period = "7776000s" # 90 days

  lifecycle {
    prevent_destroy = true
  }
}

resource "google_kms_crypto_key_iam_member" "seals" {
  crypto_key_id = google_kms_crypto_key.webhook_secrets.id
  role          = "roles/cloudkms.cryptoKeyEncrypter"
  member        = google_service_account.service["publisher"].member
}

resource "google_kms_crypto_key_iam_member" "opens" {
  crypto_key_id = google_kms_crypto_key.webhook_secrets.id
  role          = "roles/cloudkms.cryptoKeyDecrypter"
  member        = google_service_account.service["resulthandler"].member
}
