// Package chaos holds genbox's chaos suite (its tests only): the four services run as separate
// OS processes on the emulators — the worker built with its crash points — and are SIGKILLed at
// each crash point, starved by a model outage, cut off from a webhook receiver that is down for a
// while, and left with a Pub/Sub emulator restarted empty. After each scenario the suite checks
// the invariants of docs/architecture.md §0: no task lost (every task ends and its webhook is delivered), one
// webhook-id per task event (duplicates only in the documented window, counted and reported), and
// model calls and billed tokens, from the fake Gemini's ledger, ÷ what the work needed (at most
// one more generation per crash inside the paid window). Durations are short by default; -soak
// runs the long versions:
//
//	go test ./test/chaos -run . -soak -timeout 30m
//
// BenchmarkWorkerMemory runs the same stack to measure the worker process's peak RSS with 256
// model calls in flight:
//
//	go test ./test/chaos -run '^$' -bench BenchmarkWorkerMemory -benchtime=1x
package chaos
