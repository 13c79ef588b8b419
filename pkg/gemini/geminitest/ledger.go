package geminitest

import (
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Tally counts one model's (or all models') calls and billed tokens.
type Tally struct {
	// Calls is every generation call that reached a model route, whatever its outcome.
	Calls int
	// Generations is the calls that finished generating and were billed.
	Generations int
	// Failed is the calls answered with a Google error (never billed).
	Failed int
	// Abandoned is the billed generations whose client had gone before they finished.
	Abandoned int
	// CountTokens is the countTokens calls (free, and outside every limit).
	CountTokens int
	// Billed is the tokens billed: the usageMetadata of every finished generation.
	Billed task.Usage
}

func (t *Tally) add(o Tally) {
	t.Calls += o.Calls
	t.Generations += o.Generations
	t.Failed += o.Failed
	t.Abandoned += o.Abandoned
	t.CountTokens += o.CountTokens
	t.Billed = t.Billed.Add(o.Billed)
}

// Bill is one finished, billed generation.
type Bill struct {
	Request Request
	Usage   task.Usage
	// Abandoned means the client had gone (its request context was done) before the end.
	Abandoned bool
	// Started is when the call reached the fake.
	Started time.Time
}

// Ledger is a snapshot of what the fake served and billed: what a real invoice would show.
type Ledger struct {
	Total    Tally
	PerModel map[string]Tally
	// Bills lists every billed generation in the order they finished.
	Bills []Bill
}

// Model returns the tally of one model (zero when it was never called).
func (l Ledger) Model(model string) Tally { return l.PerModel[model] }

// BillsFor returns the billed generations whose prompt or system instruction contains key,
// e.g. a task id: len(l.BillsFor(id)) is how many times that task was billed.
func (l Ledger) BillsFor(key string) []Bill {
	var out []Bill
	for _, b := range l.Bills {
		if strings.Contains(b.Request.Prompt, key) || strings.Contains(b.Request.SystemInstruction, key) {
			out = append(out, b)
		}
	}
	return out
}

// BilledFor sums the tokens billed for the generations BillsFor(key) returns.
func (l Ledger) BilledFor(key string) task.Usage {
	var u task.Usage
	for _, b := range l.BillsFor(key) {
		u = u.Add(b.Usage)
	}
	return u
}

// ledger is the fake's mutable record; the Fake's mutex guards it.
type ledger struct {
	perModel map[string]*Tally
	bills    []Bill
}

func (l *ledger) tally(model string) *Tally {
	if l.perModel == nil {
		l.perModel = make(map[string]*Tally)
	}
	t := l.perModel[model]
	if t == nil {
		t = &Tally{}
		l.perModel[model] = t
	}
	return t
}

func (l *ledger) snapshot() Ledger {
	s := Ledger{PerModel: make(map[string]Tally, len(l.perModel)), Bills: append([]Bill(nil), l.bills...)}
	for m, t := range l.perModel {
		s.PerModel[m] = *t
		s.Total.add(*t)
	}
	return s
}
