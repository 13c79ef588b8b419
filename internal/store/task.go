// Package store is genbox's one Firestore access layer: it persists the task document
// (protocol.Task) with transactional read-modify-write, applying protocol.Finalize to every
// write, and holds the other collections and the registry of queries the Terraform indexes are
// checked against. The document's rules live in package protocol; store only reads and writes.
package store

// Collection names.
const (
	TasksCollection       = "tasks"
	OutputsCollection     = "outputs"
	DeadLettersCollection = "dead_letters"
	APIKeysCollection     = "api_keys"
	TenantsCollection     = "tenants"
	BreakersCollection    = "breakers"
	LeadersCollection     = "leaders"
	SweepersCollection    = "sweepers"
)
