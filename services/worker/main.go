// Command worker is genbox's worker service (docs/architecture.md §4): it pulls gemini-tasks, claims each task
// under a fenced lease, calls Gemini, persists the output before acking, and runs the
// leader-elected sweeper that carries whatever is due. Configuration comes from the environment
// (see internal/worker.FromEnv).
package main

import "github.com/genbox-dev/genbox/internal/service"

func main() { service.Main("worker", run) }
