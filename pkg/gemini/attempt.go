package gemini

import (
	"context"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Attempt describes one model call of Generate: the model, its number within the task's attempt
// budget (1 is the first call) and, once it ended, the tokens it used and the class of its
// failure ("" on success; "canceled" when the caller's context ended).
type Attempt struct {
	TaskID  string
	Tenant  string
	Model   string
	Number  int
	Usage   task.Usage
	CostUSD float64
	Class   Class
	Err     error
	// Start is when the call began; Latency how long it took (both set once it ended).
	Start   time.Time
	Latency time.Duration
}

// AttemptHook observes each model call: it is called before the call with the attempt's model
// and number and returns the context of the call (a span's, say) and a function that receives
// the finished attempt. Keep content out of what it records: Err never holds the prompt.
type AttemptHook func(ctx context.Context, a Attempt) (context.Context, func(Attempt))

// WithAttemptHook observes every model call with h (tracing, metrics).
func WithAttemptHook(h AttemptHook) Option { return func(c *Client) { c.attemptHook = h } }

// ClassCanceled is the class an AttemptHook sees when the caller's context ended the call.
const ClassCanceled Class = "canceled"

// attempt makes one model call through c.call, observed by the attempt hook when there is one,
// and adds its record to res.Attempts.
func (c *Client) attempt(ctx context.Context, number int, model string, req Request, cfg task.GenConfig, res *Result) (string, *failure, error) {
	a := Attempt{TaskID: req.TaskID, Tenant: req.Tenant, Model: model, Number: number, Start: c.clock.Now()}
	before := *res
	callCtx, done := ctx, func(Attempt) {}
	if c.attemptHook != nil {
		callCtx, done = c.attemptHook(ctx, a)
	}
	text, f, err := c.call(callCtx, model, req, cfg, res)
	a.Latency = c.clock.Now().Sub(a.Start)
	a.Usage = res.Usage.Sub(before.Usage)
	a.CostUSD = res.CostUSD - before.CostUSD
	switch {
	case err != nil:
		a.Class, a.Err = ClassCanceled, err
	case f != nil:
		a.Class, a.Err = f.class, f.err
	}
	res.Attempts = append(res.Attempts, a)
	done(a)
	return text, f, err
}
