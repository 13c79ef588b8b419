package task_test

import (
	"fmt"

	"github.com/genbox-dev/genbox/pkg/task"
)

// The end states, and the webhook event a move into each one queues.
func ExampleState_Event() {
	for _, s := range task.States {
		if s.Finished() {
			fmt.Println(s, "->", s.Event())
		}
	}
	// Output:
	// succeeded -> task.succeeded
	// failed -> task.failed
	// dead -> task.dead
	// cancelled -> task.cancelled
	// discarded -> task.discarded
}

// A receiver deduplicates on the webhook-id: retries and redeliveries of one event share it, and a
// regeneration (replay 1) gets a new one.
func ExampleEventID() {
	fmt.Println(task.EventID("t-42", task.EventSucceeded, 0))
	fmt.Println(task.EventID("t-42", task.EventSucceeded, 1))
	// Output:
	// t-42.task.succeeded.0
	// t-42.task.succeeded.1
}
