// Command dlqnotifier is genbox's human gate (docs/architecture.md §7): it posts dead letters and alerts to
// Slack, takes approvers' decisions at /slack/interactions and operators' at /admin/dead-letters,
// and consumes gemini-tasks-dlq, gemini-results-dlq and genbox-alerts by push (Cloud Run) or pull.
// Configuration comes from the environment (see internal/dlqnotifier.FromEnv).
package main

import "github.com/genbox-dev/genbox/internal/service"

func main() { service.Main("dlqnotifier", run) }
