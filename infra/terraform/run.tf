# The four Cloud Run workloads. Each one's environment is the union of the plain variables in
# local.env[svc] and the Secret Manager references in local.secret_env[svc]; internal/deploycheck
# records the variables each service's config loader asks for and fails when one is missing here.

locals {
  # The OIDC audience Pub/Sub puts in push tokens, and that the consumers check. A fixed string
  # rather than the service URL, which the service's own environment cannot reference.
  push_audience = {
    resulthandler = "genbox-resulthandler-push-${var.project_id}"
    dlqnotifier   = "genbox-dlqnotifier-push-${var.project_id}"
  }

  common_env = {
    GOOGLE_CLOUD_PROJECT = var.project_id
    # OTLP to telemetry.googleapis.com with the service account's credentials (internal/obs).
    GENBOX_TELEMETRY        = "gcp"
    OTEL_TRACES_SAMPLER     = "parentbased_traceidratio"
    OTEL_TRACES_SAMPLER_ARG = tostring(var.trace_sampling_ratio)
    GENBOX_LOG_LEVEL        = "info"
    # Prompts, outputs and secrets stay out of the logs in production.
    GENBOX_LOG_CONTENT = "false"
    # Every writer of a task spreads due_at over the shards the workers' sweepers lead.
    GENBOX_SWEEP_SHARDS = tostring(var.sweep_shards)
    # Cloud Run kills an instance 10 s after SIGTERM: what cannot finish within this grace is
    # left for another instance (the worker releases the calls it cannot persist in time).
    GENBOX_SHUTDOWN_GRACE = "8s"
  }

  # The push consumers check a push request's OIDC token themselves (its audience, and that it was
  # signed for the push account): the dlqnotifier's service is public, and the resulthandler checks
  # again what Cloud Run's IAM already did, in case its service is ever made public.
  push_env = {
    for svc, audience in local.push_audience : svc => {
      GENBOX_CONSUMER             = "push"
      GENBOX_PUSH_AUDIENCE        = audience
      GENBOX_PUSH_SERVICE_ACCOUNT = google_service_account.push.email
    }
  }

  # How a call is priced before it is made: the worker's max_cost_usd check and budgets, the
  # dlqnotifier's Regenerate estimate and the publisher's re-run estimate, which must agree.
  pricing_env = {
    GENBOX_MODEL_CHAIN = join(",", var.model_chain)
    GENBOX_PRICES = join(",", [for m, p in var.model_prices : join(";", compact([
      "${m}=${p.input_per_m}/${p.output_per_m}",
      p.flex_input_per_m == null ? "" : "flex=${p.flex_input_per_m}/${p.flex_output_per_m}",
      p.batch_input_per_m == null ? "" : "batch=${p.batch_input_per_m}/${p.batch_output_per_m}",
      p.cached_input_per_m == null ? "" : "cached=${p.cached_input_per_m}",
      p.storage_per_m_hour == null ? "" : "storage=${p.storage_per_m_hour}",
    ]))])
  }

  env = {
    publisher = merge(local.common_env, local.pricing_env, {
      OTEL_SERVICE_NAME = "publisher"
      # A submission wakes the worker pool when it sleeps at zero (internal/autoscale).
      GENBOX_AUTOSCALE_POOL = local.worker_pool_name
      # status_url is built from each request's Host unless a custom domain is configured.
      GENBOX_PUBLIC_URL = var.publisher_public_url
      # Callback URLs must be https to public addresses (docs/architecture.md §6), on these ports.
      GENBOX_ALLOW_INSECURE_CALLBACKS = "false"
      GENBOX_CALLBACK_PORTS           = length(var.callback_ports) == 0 ? "any" : join(",", var.callback_ports)
      # Seals the webhook secrets it creates and rotates (kms.tf: encrypt only).
      GENBOX_WEBHOOK_SECRETS_KEY = local.webhook_secrets_key
      # Where the client's address is in X-Forwarded-For, to count failed API keys per client.
      GENBOX_TRUSTED_PROXY_HOPS = tostring(var.trusted_proxy_hops.publisher)
      # Uploads are signed into the input bucket (storage.tf); a task names at most this many files.
      GENBOX_INPUT_BUCKET = google_storage_bucket.input.name
      GENBOX_MAX_FILES    = tostring(var.max_files_per_task)
    })

    worker = merge(local.common_env, local.pricing_env, {
      OTEL_SERVICE_NAME     = "worker"
      GENBOX_GEMINI_BACKEND = var.gemini_backend
      # Tasks' files: read from Cloud Storage at their recorded generation (storage.tf).
      GENBOX_INPUT_BUCKET   = google_storage_bucket.input.name
      GOOGLE_CLOUD_LOCATION = var.vertex_location
      GENBOX_RPM            = join(",", [for m, n in var.model_rpm : "${m}=${n}"])
      GENBOX_TPM            = join(",", [for m, n in var.model_tpm : "${m}=${n}"])
      # Each instance takes its share of the project's Gemini quota: 1/instances, read from the
      # autoscaler's document once it has started; this is the share of a full pool until then.
      GENBOX_INSTANCE_SHARE     = format("%.6f", 1 / var.worker_max_instances)
      GENBOX_TASKS_SUBSCRIPTION = google_pubsub_subscription.subscriptions["gemini-tasks-worker"].name
      GENBOX_CONCURRENCY        = tostring(var.worker_concurrency)
      # Money is limited out of the box: a tenant without a budget of its own gets the default,
      # and every tenant together stops at the project's budget (fail closed).
      GENBOX_DEFAULT_DAILY_BUDGET_USD = tostring(var.default_tenant_daily_budget_usd)
      GENBOX_PROJECT_DAILY_BUDGET_USD = tostring(var.project_daily_budget_usd)
      # The autoscaler (internal/autoscale) sizes this pool between min and max.
      GENBOX_AUTOSCALE_POOL = local.worker_pool_name
      GENBOX_AUTOSCALE_MIN  = tostring(var.worker_min_instances)
      GENBOX_AUTOSCALE_MAX  = tostring(var.worker_max_instances)
      # Once a week one instance sends a small request per family through each fallback model
      # and posts what they answered to the alerts channel (off by default, as in genbox dev).
      GENBOX_FALLBACK_DRILL_INTERVAL = "168h"
      # A schedule's fire is validated as the publisher validates a request (internal/schedule).
      GENBOX_ALLOW_INSECURE_CALLBACKS = "false"
      GENBOX_CALLBACK_PORTS           = length(var.callback_ports) == 0 ? "any" : join(",", var.callback_ports)
    })

    resulthandler = merge(local.common_env, local.push_env.resulthandler, {
      OTEL_SERVICE_NAME = "resulthandler"
      # Callback URLs must be https to public addresses (the SSRF guard, docs/architecture.md §6).
      GENBOX_ALLOW_INSECURE_CALLBACKS = "false"
      # Opens the webhook secrets it signs with (kms.tf: decrypt only).
      GENBOX_WEBHOOK_SECRETS_KEY = local.webhook_secrets_key
    })

    # Public: the app alone checks a push request's OIDC token (local.push_env).
    dlqnotifier = merge(local.common_env, local.pricing_env, local.push_env.dlqnotifier, {
      OTEL_SERVICE_NAME = "dlqnotifier"
      # A Regenerate wakes the worker pool when it sleeps at zero (internal/autoscale).
      GENBOX_AUTOSCALE_POOL  = local.worker_pool_name
      GENBOX_SLACK_CHANNEL   = var.slack_channel
      GENBOX_SLACK_APPROVERS = join(",", var.slack_approvers)
      # 2 behind an external HTTPS load balancer (IAP in front of the console, docs/console.md).
      GENBOX_TRUSTED_PROXY_HOPS = tostring(var.trusted_proxy_hops.dlqnotifier)
    })
  }

  # Environment variables read from Secret Manager: variable name => key of local.secrets.
  secret_env = {
    for svc, keys in local.reads_secrets : svc => { for k in keys : local.secrets[k].env => k }
  }

  images = { for svc in local.services : svc => "${local.image_base}/${svc}:${var.image_tag}" }
}

# The three request-driven services. Request-based billing (cpu_idle): nothing they do may rely
# on CPU after the response, which docs/architecture.md §7 already demands.
locals {
  # What the push consumers share: Pub/Sub waits for a push response no longer than the ack
  # deadline, and each instance takes up to 40 pushes at once.
  push_service = {
    timeout     = "${local.ack_deadline_seconds}s"
    concurrency = 40
  }

  http_services = {
    # The REST API; its own API keys authenticate every /v1 route.
    publisher = {
      description = "genbox REST API: apps submit and poll tasks with their API keys."
      ingress     = "INGRESS_TRAFFIC_ALL"
      audiences   = []
      timeout     = "30s"
      concurrency = 80
    }
    # Private: only Pub/Sub push (the push service account's OIDC token, checked by Cloud Run)
    # may invoke it.
    resulthandler = merge(local.push_service, {
      description = "genbox result handler: delivers signed webhooks, consuming gemini-results by push."
      ingress     = "INGRESS_TRAFFIC_INTERNAL_ONLY"
      audiences   = [local.push_audience.resulthandler]
    })
    # Public, because Slack must reach /slack/interactions. The app authenticates every other
    # route itself: push by its OIDC token (audience and signer), admin routes by the key. Its
    # push audience is listed so that tokens stay valid should the service be made private.
    dlqnotifier = merge(local.push_service, {
      description = "genbox DLQ notifier: posts dead letters and alerts to Slack; the approval gate."
      ingress     = "INGRESS_TRAFFIC_ALL"
      audiences   = [local.push_audience.dlqnotifier]
    })
  }
}

resource "google_cloud_run_v2_service" "http" {
  for_each = local.http_services

  project             = var.project_id
  name                = "genbox-${each.key}"
  location            = var.region
  description         = each.value.description
  ingress             = each.value.ingress
  custom_audiences    = each.value.audiences
  deletion_protection = var.deletion_protection

  template {
    service_account                  = google_service_account.service[each.key].email
    timeout                          = each.value.timeout
    max_instance_request_concurrency = each.value.concurrency

    scaling {
      min_instance_count = 0
      max_instance_count = var.max_instances[each.key]
    }

    containers {
      image = local.images[each.key]

      resources {
        limits = {
          cpu    = "1"
          memory = "512Mi"
        }
        cpu_idle = true
      }

      dynamic "env" {
        for_each = local.env[each.key]
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.secret_env[each.key]
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = google_secret_manager_secret.secrets[env.value].secret_id
              version = var.secret_version
            }
          }
        }
      }

      startup_probe {
        http_get {
          path = "/healthz"
        }
      }

      liveness_probe {
        http_get {
          path = "/healthz"
        }
      }
    }
  }

  depends_on = [google_project_service.required, google_secret_manager_secret_iam_member.reads]
}

# The worker pulls from gemini-tasks-worker and needs CPU between requests: a worker pool scaled
# manually by genbox's own autoscaler (internal/autoscale), which drains the pool before lowering
# its count, so no instance is stopped in the middle of a paid generation (docs/deploy.md).
locals {
  worker_pool_name = "projects/${var.project_id}/locations/${var.region}/workerPools/genbox-worker"
}

resource "google_cloud_run_v2_worker_pool" "worker" {
  project             = var.project_id
  name                = "genbox-worker"
  location            = var.region
  description         = "genbox worker: claims tasks, calls Gemini, persists outputs; runs the sweeper."
  deletion_protection = var.deletion_protection
  # Worker pools were a preview feature when the 6.x provider line was current.
  launch_stage = "BETA"

  # Worker pools scale manually: the autoscaler sets the count through the Admin API from then
  # on, so Terraform creates the pool at the minimum and leaves the count alone afterwards. (The
  # provider also offers scaling_mode, copied from services; the WorkerPool API has no such field.)
  scaling {
    manual_instance_count = var.worker_min_instances
  }

  lifecycle {
    ignore_changes = [scaling[0].manual_instance_count]
  }

  template {
    service_account = google_service_account.service["worker"].email

    containers {
      image = local.images.worker

      resources {
        limits = {
          cpu    = "2"
          memory = "1Gi"
        }
      }

      dynamic "env" {
        for_each = local.env.worker
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.secret_env.worker
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = google_secret_manager_secret.secrets[env.value].secret_id
              version = var.secret_version
            }
          }
        }
      }
    }
  }

  depends_on = [google_project_service.required, google_secret_manager_secret_iam_member.reads]
}

resource "google_cloud_run_v2_service_iam_member" "public" {
  for_each = toset(["publisher", "dlqnotifier"])

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.http[each.key].name
  role     = "roles/run.invoker"
  member   = "allUsers"
}

resource "google_cloud_run_v2_service_iam_member" "push_invokes_resulthandler" {
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.http["resulthandler"].name
  role     = "roles/run.invoker"
  member   = google_service_account.push.member
}
