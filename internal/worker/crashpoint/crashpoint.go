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
)

// Points lists every crash point.
var Points = []Point{BeforeClaim, AfterClaim, MidGenerate, Answered, AfterCommit, AfterPublish}

// armed is set only by the genbox_crashpoints build (arm.go); it stays nil in production.
var armed func(Point)

// Hit crashes the process if the test build armed p; otherwise it does nothing.
func Hit(p Point) {
	if armed != nil {
		armed(p)
	}
}
