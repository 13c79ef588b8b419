// Command publisher is genbox's REST API service (docs/architecture.md §8): apps submit, read, list, cancel and
// erase tasks; admins manage tenants, API keys and webhook secrets. Configuration comes from the
// environment (see internal/publisher.FromEnv).
package main

import "github.com/genbox-dev/genbox/internal/service"

func main() { service.Main("publisher", run) }
