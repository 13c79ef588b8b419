variable "project_id" {
  description = "Google Cloud project that runs genbox (an existing project with billing enabled)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a project ID: 6-30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "region" {
  description = "Region of the Cloud Run services, the worker pool and the Artifact Registry repository."
  type        = string
  default     = "us-central1"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]$", var.region))
    error_message = "region must be a Cloud Run region such as us-central1 or europe-west1."
  }
}

variable "firestore_location" {
  description = "Location of the (default) Firestore database: a region (us-central1) or a multi-region (nam5, eur3). It cannot change after creation. Empty means the same as region."
  type        = string
  default     = ""

  validation {
    condition     = var.firestore_location == "" || can(regex("^([a-z]+-[a-z]+[0-9]|nam[0-9]+|eur[0-9]+)$", var.firestore_location))
    error_message = "firestore_location must be empty, a region (us-central1) or a multi-region (nam5, eur3)."
  }
}

variable "image_tag" {
  description = "Tag of the four service images in Artifact Registry; Cloud Build passes the commit's $SHORT_SHA."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", var.image_tag))
    error_message = "image_tag must be a Docker tag: letters, digits, '_', '.', '-', at most 128 characters."
  }
}

variable "artifact_repository" {
  description = "Name of the Artifact Registry Docker repository that holds the service images."
  type        = string
  default     = "genbox"

  validation {
    condition     = can(regex("^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", var.artifact_repository))
    error_message = "artifact_repository must be lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "sweep_shards" {
  description = "Sweep shards (GENBOX_SWEEP_SHARDS): each has its own leader among the worker instances, and its own range of the due_at index. Re-drive throughput and the index's write ceiling grow with it; size it in docs/capacity.md."
  type        = number
  default     = 4

  validation {
    condition     = var.sweep_shards >= 1 && var.sweep_shards <= 128 && floor(var.sweep_shards) == var.sweep_shards
    error_message = "sweep_shards must be a whole number from 1 to 128."
  }
}

variable "worker_min_instances" {
  description = "Fewest worker instances the autoscaler keeps (internal/autoscale); 0 lets the pool sleep when nothing is pending, and the first submission wakes it. Set min = max for a fixed pool."
  type        = number
  default     = 0

  validation {
    condition     = var.worker_min_instances >= 0 && var.worker_min_instances <= 100 && floor(var.worker_min_instances) == var.worker_min_instances
    error_message = "worker_min_instances must be a whole number from 0 to 100."
  }
}

variable "worker_max_instances" {
  description = "Most worker instances the autoscaler starts under a backlog. The Gemini rate limits are shared between the live instances (each takes 1/instances)."
  type        = number
  default     = 10

  validation {
    condition     = var.worker_max_instances >= 1 && var.worker_max_instances <= 100 && floor(var.worker_max_instances) == var.worker_max_instances && var.worker_max_instances >= var.worker_min_instances
    error_message = "worker_max_instances must be a whole number from 1 to 100, at least worker_min_instances."
  }
}

variable "max_instances" {
  description = "Autoscaling ceiling of each request-driven service (publisher, resulthandler, dlqnotifier)."
  type = object({
    publisher     = number
    resulthandler = number
    dlqnotifier   = number
  })
  default = {
    publisher     = 10
    resulthandler = 10
    dlqnotifier   = 3
  }

  validation {
    condition     = alltrue([for n in values(var.max_instances) : n >= 1 && n <= 1000 && floor(n) == n])
    error_message = "Each max_instances value must be a whole number from 1 to 1000."
  }
}

variable "trusted_proxy_hops" {
  description = "GENBOX_TRUSTED_PROXY_HOPS of each public service: how many addresses its front ends append to X-Forwarded-For, so that failed credentials are counted per client. 1: Cloud Run's own front end; 2: behind an external HTTPS load balancer (a serverless NEG, as for IAP in front of the console)."
  type = object({
    publisher   = number
    dlqnotifier = number
  })
  default = {
    publisher   = 1
    dlqnotifier = 1
  }

  validation {
    condition     = alltrue([for n in values(var.trusted_proxy_hops) : n >= 0 && n <= 10 && floor(n) == n])
    error_message = "Each trusted_proxy_hops value must be a whole number from 0 to 10."
  }
}

variable "gemini_backend" {
  description = "How the worker reaches Gemini: \"gemini\" (the Gemini API with GEMINI_API_KEY from Secret Manager) or \"vertex\" (Vertex AI with the worker's service account)."
  type        = string
  default     = "gemini"

  validation {
    condition     = contains(["gemini", "vertex"], var.gemini_backend)
    error_message = "gemini_backend must be \"gemini\" or \"vertex\"."
  }
}

variable "vertex_location" {
  description = "Vertex AI location used when gemini_backend is \"vertex\" (\"global\" or a region)."
  type        = string
  default     = "global"

  validation {
    condition     = var.vertex_location == "global" || can(regex("^[a-z]+-[a-z]+[0-9]$", var.vertex_location))
    error_message = "vertex_location must be \"global\" or a region such as us-central1."
  }
}

variable "model_chain" {
  description = "Models tried in order for a generation; a later one is a fallback (the task is marked degraded)."
  type        = list(string)
  default     = ["gemini-2.5-flash", "gemini-2.5-flash-lite"]

  validation {
    condition     = length(var.model_chain) > 0 && alltrue([for m in var.model_chain : can(regex("^[a-z0-9][a-z0-9.-]*$", m))])
    error_message = "model_chain must name at least one model, each in lowercase letters, digits, '.' and '-'."
  }
}

variable "model_rpm" {
  description = "Requests per minute the project's Gemini quota allows, per model. The live worker instances share it (each takes 1/instances, following the autoscaler). Empty means no client-side limit."
  type        = map(number)
  default     = {}

  validation {
    condition     = alltrue([for n in values(var.model_rpm) : n > 0])
    error_message = "Every model_rpm value must be positive."
  }
}

variable "model_tpm" {
  description = "Tokens per minute the project's Gemini quota allows, per model, shared like model_rpm."
  type        = map(number)
  default     = {}

  validation {
    condition     = alltrue([for n in values(var.model_tpm) : n > 0])
    error_message = "Every model_tpm value must be positive."
  }
}

variable "slack_channel" {
  description = "Slack channel ID (C...) where the dlqnotifier posts dead letters and alerts."
  type        = string

  validation {
    condition     = can(regex("^[CG][A-Z0-9]{6,}$", var.slack_channel))
    error_message = "slack_channel must be a Slack channel ID such as C0123456789 (not a #name)."
  }
}

variable "slack_approvers" {
  description = "Slack user IDs (U...) allowed to press Redeliver, Regenerate or Discard."
  type        = list(string)

  validation {
    condition     = length(var.slack_approvers) > 0 && alltrue([for u in var.slack_approvers : can(regex("^[UW][A-Z0-9]{6,}$", u))])
    error_message = "slack_approvers must list at least one Slack user ID such as U0123456789."
  }
}

variable "secret_version" {
  description = "Secret Manager version every service reads (\"latest\", or a number to pin). A new version reaches a service when its next revision or instance starts."
  type        = string
  default     = "latest"

  validation {
    condition     = var.secret_version == "latest" || can(regex("^[1-9][0-9]*$", var.secret_version))
    error_message = "secret_version must be \"latest\" or a version number."
  }
}

variable "trace_sampling_ratio" {
  description = "Fraction of new traces sampled (a trace started upstream keeps its parent's decision)."
  type        = number
  default     = 0.1

  validation {
    condition     = var.trace_sampling_ratio >= 0 && var.trace_sampling_ratio <= 1
    error_message = "trace_sampling_ratio must be between 0 and 1."
  }
}

variable "alert_email" {
  description = "E-mail address that Cloud Monitoring alerts go to. Empty: alerts are only shown in the console (the dlqnotifier's Slack alerts are separate)."
  type        = string
  default     = ""

  validation {
    condition     = var.alert_email == "" || can(regex("^[^@[:space:]]+@[^@[:space:]]+\\.[^@[:space:]]+$", var.alert_email))
    error_message = "alert_email must be empty or an e-mail address."
  }
}

variable "alert_daily_cost_usd" {
  description = "Alert when the Gemini cost of the last 24 hours, as genbox counts it, exceeds this many USD."
  type        = number
  default     = 50

  validation {
    condition     = var.alert_daily_cost_usd > 0
    error_message = "alert_daily_cost_usd must be positive."
  }
}

variable "alert_oldest_pending_minutes" {
  description = "Alert when the oldest pending work (now - pending_since) is older than this many minutes."
  type        = number
  default     = 30

  validation {
    condition     = var.alert_oldest_pending_minutes >= 1
    error_message = "alert_oldest_pending_minutes must be at least 1."
  }
}

variable "alert_error_ratio" {
  description = "Alert when more than this fraction of the tasks that finished in the last 15 minutes failed or died."
  type        = number
  default     = 0.1

  validation {
    condition     = var.alert_error_ratio > 0 && var.alert_error_ratio < 1
    error_message = "alert_error_ratio must be between 0 and 1 (exclusive)."
  }
}

variable "deletion_protection" {
  description = "Refuse to delete the Cloud Run services, the worker pool and the Firestore database (set false only to tear a test project down)."
  type        = bool
  default     = true
}

variable "labels" {
  description = "Extra labels put on every resource that takes labels."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.labels : can(regex("^[a-z][a-z0-9_-]{0,62}$", k)) && can(regex("^[a-z0-9_-]{0,63}$", v))])
    error_message = "Label keys must start with a lowercase letter; keys and values use lowercase letters, digits, '_' and '-' (at most 63 characters)."
  }
}

variable "callback_ports" {
  description = "The ports a task's callback_url may name (its scheme's default when it names none): GENBOX_CALLBACK_PORTS. Empty: any port."
  type        = list(number)
  default     = [443, 8443]

  validation {
    condition     = alltrue([for p in var.callback_ports : p >= 1 && p <= 65535 && floor(p) == p])
    error_message = "callback_ports must hold ports between 1 and 65535."
  }
}

variable "publisher_public_url" {
  description = "Base URL of the publisher as apps see it (a custom domain), used in status_url. Empty: taken from each request's Host."
  type        = string
  default     = ""

  validation {
    condition     = var.publisher_public_url == "" || can(regex("^https://[^/[:space:]]+$", var.publisher_public_url))
    error_message = "publisher_public_url must be empty or https://host with no path or trailing slash."
  }
}

variable "model_prices" {
  description = "Price overrides in USD per million tokens, per model, for the cost genbox records and alerts on (docs/cost.md): standard input and output; optionally the flex and batch tiers (default half the standard), cached input (default a tenth of the input) and cache storage per million tokens per hour (default the built-in table's; 0: no explicit cache). Models not named keep the built-in prices (pkg/gemini.DefaultPrices)."
  type = map(object({
    input_per_m        = number
    output_per_m       = number
    flex_input_per_m   = optional(number)
    flex_output_per_m  = optional(number)
    batch_input_per_m  = optional(number)
    batch_output_per_m = optional(number)
    cached_input_per_m = optional(number)
    storage_per_m_hour = optional(number)
  }))
  default = {}

  validation {
    condition = alltrue([for p in values(var.model_prices) : alltrue([for v in [p.input_per_m, p.output_per_m, p.flex_input_per_m, p.flex_output_per_m,
    p.batch_input_per_m, p.batch_output_per_m, p.cached_input_per_m, p.storage_per_m_hour] : v == null ? true : v >= 0])])
    error_message = "model_prices must not be negative."
  }

  validation {
    condition = alltrue([for p in values(var.model_prices) : (p.flex_input_per_m == null) == (p.flex_output_per_m == null) &&
    (p.batch_input_per_m == null) == (p.batch_output_per_m == null)])
    error_message = "model_prices: set a tier's input and output together."
  }
}

variable "worker_concurrency" {
  description = "Model calls each worker instance runs at once: its model-call slots (most of the time is spent waiting on Gemini, so this is well above the CPU count). The claim reserve and the messages in hand are derived from it."
  type        = number
  default     = 64

  validation {
    condition     = var.worker_concurrency >= 1 && var.worker_concurrency <= 1000 && floor(var.worker_concurrency) == var.worker_concurrency
    error_message = "worker_concurrency must be a whole number from 1 to 1000."
  }
}

variable "default_tenant_daily_budget_usd" {
  description = "Daily budget in USD of a tenant whose limits set none (GENBOX_DEFAULT_DAILY_BUDGET_USD); 0 leaves such tenants unlimited."
  type        = number
  default     = 10

  validation {
    condition     = var.default_tenant_daily_budget_usd >= 0
    error_message = "default_tenant_daily_budget_usd must not be negative."
  }
}

variable "project_daily_budget_usd" {
  description = "Daily budget in USD of every tenant together (GENBOX_PROJECT_DAILY_BUDGET_USD): when it is spent, or its counter cannot be read, no Gemini call starts; 0 turns it off."
  type        = number
  default     = 100

  validation {
    condition     = var.project_daily_budget_usd >= 0
    error_message = "project_daily_budget_usd must not be negative."
  }
}

variable "input_bucket" {
  description = "Name of the input bucket tasks' uploads go to (storage.tf); empty: <project_id>-genbox-input."
  type        = string
  default     = ""
}

variable "max_files_per_task" {
  description = "The most files one task may name (GENBOX_MAX_FILES); a family may allow fewer."
  type        = number
  default     = 10

  validation {
    condition     = var.max_files_per_task >= 0 && var.max_files_per_task == floor(var.max_files_per_task)
    error_message = "max_files_per_task must be a whole number, 0 or more."
  }
}
