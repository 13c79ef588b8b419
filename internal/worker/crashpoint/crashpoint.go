// Package crashpoint marks the places in the worker where the crash-matrix tests kill the
// process. In a production build Hit does nothing and nothing can arm it: the arming code is
// compiled only with the genbox_crashpoints build tag, which only the tests use.
package crashpoint

// Point names a place in the worker protocol (docs/architecture.md §4).
type Point string

// The crash points of the crash matrix, in protocol order.
const (
	BeforeClaim  Point = "before_claim"
	AfterClaim   Point = "after_claim"
	MidGenerate  Point = "mid_generation"
	Answered     Point = "answered"      // the model answered; the output is not committed yet
	AfterCommit  Point = "after_commit"  // the output is committed; the result nudge not published
	AfterPublish Point = "after_publish" // the result nudge is published; the message not acked
	// FileCopied: a file of the task is in the Files API; the copy is not recorded on the task.
	FileCopied Point = "file_copied"
	// FileRecorded: the copy is recorded on the task; the model not called yet.
	FileRecorded Point = "file_recorded"
)

// Points lists every crash point of the online protocol.
var Points = []Point{BeforeClaim, AfterClaim, MidGenerate, Answered, AfterCommit, AfterPublish}

// FilePoints are the crash points a task with files meets besides Points, between the claim
// and the call, on the Gemini API.
var FilePoints = []Point{FileCopied, FileRecorded}

// The crash points of the batcher (internal/batcher), in the order a batch job meets them.
const (
	BatchClaimed    Point = "batch_claimed"    // batch_jobs/{id} and its tasks' claims written; batches.create not called
	BatchCreated    Point = "batch_created"    // batches.create answered; its job name not recorded
	BatchRecorded   Point = "batch_recorded"   // the job name recorded; not yet polled
	BatchMidPoll    Point = "batch_mid_poll"   // a poll answered; what it said not recorded
	BatchPersisting Point = "batch_persisting" // the first response of a done job persisted; the others not
)

// BatchPoints lists every crash point of the batcher.
var BatchPoints = []Point{BatchClaimed, BatchCreated, BatchRecorded, BatchMidPoll, BatchPersisting}

// armed is set only by the genbox_crashpoints build (arm.go); it stays nil in production.
var armed func(Point)

// Hit crashes the process if the test build armed p; otherwise it does nothing.
func Hit(p Point) {
	if armed != nil {
		armed(p)
	}
}
