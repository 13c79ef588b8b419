package geminitest

import (
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
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
	// Shed is the flex calls the flex tier shed (answered 503, counted in Failed too).
	Shed int
	// Batched is the generations run inside batch jobs (counted in Calls and Generations too).
	Batched int
	// Billed is the tokens billed: the usageMetadata of every finished generation.
	Billed task.Usage
}

func (t *Tally) add(o Tally) {
	t.Calls += o.Calls
	t.Generations += o.Generations
	t.Failed += o.Failed
	t.Abandoned += o.Abandoned
	t.CountTokens += o.CountTokens
	t.Shed += o.Shed
	t.Batched += o.Batched
	t.Billed = t.Billed.Add(o.Billed)
}

// Bill is one finished, billed generation.
type Bill struct {
	Request Request
	Usage   task.Usage
	// Tier is the tier that served it, and so its price: TierStandard, TierFlex or TierBatch.
	Tier string
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
	// Caches lists every cachedContents resource ever created, with its storage so far.
	Caches []CacheBill
	// Batches lists every batch job ever created, in creation order.
	Batches []BatchRecord
	// BatchesRefused counts the batch creates refused for their size (SetBatchByteLimit).
	BatchesRefused int
}

// CacheBill is what a cachedContents resource is billed for: its tokens once at the input price
// when created, and their storage from its creation until it expires or is deleted (a live
// cache's current expiry: what the invoice will show unless it is extended or deleted).
type CacheBill struct {
	Name, DisplayName, Model string
	Tokens                   int64
	// Files are the files the cache holds, as the fake read them when it was created.
	Files      []File
	Start, End time.Time
}

// Hours is how long the cache was stored.
func (c CacheBill) Hours() float64 { return c.End.Sub(c.Start).Hours() }

// BatchRecord is a batch job as the fake ran it.
type BatchRecord struct {
	Name, DisplayName, Model string
	// State is the job's batch state (BatchSucceeded, BatchFailed, ...).
	State string
	// Requests is the number of requests of the job; Failed is how many answered an error.
	Requests, Failed int
	// Deleted: the job was deleted (DELETE batches/{id}), with its requests and responses.
	Deleted bool
	// Bytes is the size of the create call's body.
	Bytes int
}

// BatchesNamed returns the batch jobs created with displayName: more than one means a batch was
// submitted twice.
func (l Ledger) BatchesNamed(displayName string) []BatchRecord {
	var out []BatchRecord
	for _, b := range l.Batches {
		if b.DisplayName == displayName {
			out = append(out, b)
		}
	}
	return out
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

// CostUSD is what the bill cost at p's prices: its prompt and output at its tier's rates, its
// cached prompt tokens at the cached rate.
func (b Bill) CostUSD(p gemini.Pricing) float64 {
	return p.Price(b.Request.Model).Bill(b.Usage, gemini.Tier(b.Tier))
}

// CostUSD is the invoice at p's prices: every bill at its tier, with cached tokens at the cached
// rate, and every cache's creation and storage.
func (l Ledger) CostUSD(p gemini.Pricing) float64 {
	var usd float64
	for _, b := range l.Bills {
		usd += b.CostUSD(p)
	}
	for _, c := range l.Caches {
		usd += c.CostUSD(p)
	}
	return usd
}

// CostUSD is what the cache costs at p's prices: its tokens once at the input price, and their
// storage.
func (c CacheBill) CostUSD(p gemini.Pricing) float64 {
	price := p.Price(c.Model)
	return price.Cost(c.Tokens, 0) + price.Storage(c.Tokens, c.Hours())
}
