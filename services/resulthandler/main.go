// Command resulthandler is genbox's webhook delivery service (docs/architecture.md §6): it consumes
// gemini-results nudges (by push on Cloud Run, or by streaming pull), and delivers each task's
// pending webhook, signed, through the SSRF guard, recording every attempt in Firestore.
// Configuration comes from the environment (see internal/resulthandler.FromEnv).
package main

import "github.com/genbox-dev/genbox/internal/service"

func main() { service.Main("resulthandler", run) }
