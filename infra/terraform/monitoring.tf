# Alerts and a dashboard on genbox's own metrics (internal/obs). The services export them with
# OTLP to telemetry.googleapis.com, which writes every OTLP metric through its Prometheus mapping:
# the metric type is prometheus.googleapis.com/<name>/<kind> on the prometheus_target resource,
# the name kept as the SDK sent it (dots included). So the conditions are PromQL, selecting by
# {__name__="..."}, which works whatever characters the name holds. Pub/Sub backlog metrics say
# little here: nudges are acked at once, and the pending work lives in Firestore.

locals {
  # Metric names: internal/obs Metric* constants (internal/deploycheck checks every name used here).
  metric = {
    tasks         = "genbox.tasks"
    cost          = "genbox.cost_usd"
    dead_letters  = "genbox.dead_letters.open"
    pending_age   = "genbox.pending.oldest_age"
    gen_latency   = "genbox.generation.latency"
    webhook_tries = "genbox.webhook.attempts"
  }

  alerts = {
    dead_letters = {
      display_name = "genbox: dead letters awaiting a decision"
      severity     = "WARNING"
      condition    = "open dead letters > 0"
      query        = "max(max_over_time({__name__=\"${local.metric.dead_letters}\"}[10m])) > 0"
      duration     = "300s"
      interval     = "60s"
      auto_close   = "86400s"
      doc          = "Tasks or deliveries are dead and wait for a human: decide in Slack (Redeliver / Regenerate / Discard) or with `genbox dlq list`."
    }
    pending_age = {
      display_name = "genbox: oldest pending work too old"
      severity     = "ERROR"
      condition    = "now - pending_since > ${var.alert_oldest_pending_minutes} min"
      query        = "max({__name__=\"${local.metric.pending_age}\"}) > ${var.alert_oldest_pending_minutes * 60}"
      duration     = "300s"
      interval     = "60s"
      auto_close   = "3600s"
      doc          = "Work is due but not progressing: check the worker pool (instances running, logs), every model's breaker, the Gemini quota and the sweeper's leader lease."
    }
    error_ratio = {
      display_name = "genbox: task failure ratio"
      severity     = "ERROR"
      condition    = "failed or dead / finished > ${var.alert_error_ratio} over 15 min"
      query        = "sum(rate({__name__=\"${local.metric.tasks}\", state=~\"failed|dead\"}[15m])) / sum(rate({__name__=\"${local.metric.tasks}\", state=~\"succeeded|failed|dead\"}[15m])) > ${var.alert_error_ratio}"
      duration     = "600s"
      interval     = "60s"
      auto_close   = "3600s"
      doc          = "Many tasks end failed or dead. The worker's logs give each error class; a permanent class (400/403, safety) points at requests or the API key, a transient one at Gemini."
    }
    daily_cost = {
      display_name = "genbox: Gemini cost over 24 h"
      severity     = "WARNING"
      condition    = "cost of the last 24 h > ${var.alert_daily_cost_usd} USD"
      query        = "sum(increase({__name__=\"${local.metric.cost}\"}[1d])) > ${var.alert_daily_cost_usd}"
      duration     = "0s"
      interval     = "300s"
      auto_close   = "86400s"
      doc          = "genbox's own cost estimate (tokens x price table) passed the threshold. Per-tenant daily budgets are soft limits; see the dashboard's cost by tenant."
    }
  }

  alert_channels = [for c in google_monitoring_notification_channel.email : c.id]
}

resource "google_monitoring_notification_channel" "email" {
  count = var.alert_email == "" ? 0 : 1

  project      = var.project_id
  display_name = "genbox alerts"
  type         = "email"
  labels = {
    email_address = var.alert_email
  }

  depends_on = [google_project_service.required]
}

resource "google_monitoring_alert_policy" "genbox" {
  for_each = local.alerts

  project      = var.project_id
  display_name = each.value.display_name
  combiner     = "OR"
  severity     = each.value.severity

  conditions {
    display_name = each.value.condition
    condition_prometheus_query_language {
      query               = each.value.query
      duration            = each.value.duration
      evaluation_interval = each.value.interval
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = each.value.doc
  }

  alert_strategy {
    auto_close = each.value.auto_close
  }

  notification_channels = local.alert_channels
  depends_on            = [google_project_service.required]
}

resource "google_monitoring_dashboard" "genbox" {
  project = var.project_id
  dashboard_json = jsonencode({
    displayName = "genbox"
    mosaicLayout = {
      columns = 48
      tiles = [
        for i, w in [
          { title = "Tasks entering each state (per minute)", query = "sum by (state) (rate({__name__=\"${local.metric.tasks}\"}[5m])) * 60" },
          { title = "Oldest pending work (seconds)", query = "max({__name__=\"${local.metric.pending_age}\"})" },
          { title = "Open dead letters by stage", query = "max by (stage) ({__name__=\"${local.metric.dead_letters}\"})" },
          { title = "Cost per hour by tenant (USD)", query = "sum by (tenant) (increase({__name__=\"${local.metric.cost}\"}[1h]))" },
          { title = "Generation latency p95 by model (s)", query = "histogram_quantile(0.95, sum by (model, le) (rate({__name__=\"${local.metric.gen_latency}_bucket\"}[5m])))" },
          { title = "Webhook attempts by outcome (per minute)", query = "sum by (outcome) (rate({__name__=\"${local.metric.webhook_tries}\"}[5m])) * 60" },
          ] : {
          xPos   = (i % 2) * 24
          yPos   = floor(i / 2) * 16
          width  = 24
          height = 16
          widget = {
            title = w.title
            xyChart = {
              dataSets = [{
                plotType        = "LINE"
                timeSeriesQuery = { prometheusQuery = w.query }
              }]
            }
          }
        }
      ]
    }
  })

  depends_on = [google_project_service.required]
}
