// Package gemini makes model calls that never waste money: it classifies errors, retries with
// jittered backoff inside one attempt budget, falls back along a family's model chain, keeps a
// circuit breaker and token-aware rate limits per model, and counts tokens and cost per call.
package gemini

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Class is the class of a failed model call (docs/architecture.md §5).
type Class string

// Error classes.
const (
	// Transient: 429 and 5xx. Retry with backoff, then fall back.
	Transient Class = "transient"
	// Permanent: 400/401/403/404 or a safety block. Never retried.
	Permanent Class = "permanent"
	// Network: a timeout or reset. The call may have been billed; its tokens are recorded in doubt.
	Network Class = "network"
	// Quality: the model answered 200 but the output failed the family's validator.
	Quality Class = "quality"
	// Budget: the estimate exceeds max_cost_usd or the tenant's budget; no call was made.
	Budget Class = "budget"
	// Shed: the Flex tier had no capacity for a flex request (503 UNAVAILABLE). Not a failure of
	// the model: it neither trips the breaker nor falls back; the caller retries it later, or on
	// the standard tier.
	Shed Class = "shed"
)

// ErrUnavailable means every model of the chain has an open circuit breaker: the task should be
// parked, not failed, and no call was made.
var ErrUnavailable = errors.New("gemini: every model of the chain is unavailable")

// Error is a classified failure of Generate, after its retries and fallbacks. A caller that
// reschedules the request reads RetryAfter and RateLimited with errors.As.
type Error struct {
	Class Class
	Code  int    // HTTP status when the model answered, else 0
	Model string // the model of the last attempt
	// RetryAfter is how long until every model the servers asked to wait on (RetryInfo) may be
	// called again: the longest delay still running when Generate returned. A reschedule sooner
	// would come back to a model that said not yet.
	RetryAfter time.Duration
	// RateLimited means every failed call was a 429 whose RetryInfo asked for a delay: the
	// request was turned away for the quota, never answered, so it spent no attempt's worth of
	// the model's judgement and nothing was billed.
	RateLimited bool
	Err         error
}

func (e *Error) Error() string {
	return fmt.Sprintf("gemini %s (%s, code %d): %v", e.Class, e.Model, e.Code, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ClassOf returns the class of err, or "" when err is not a classified *Error.
func ClassOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return ""
}

// Request is one task's generation, rendered from its prompt family.
type Request struct {
	TaskID string
	Tenant string
	// Models is the fallback chain; the first is the primary.
	Models            []string
	SystemInstruction string
	Prompt            string
	// Files are sent as fileData parts beside Prompt, before it unless FilesAfter.
	Files      []File
	FilesAfter bool
	Config     task.GenConfig
	// ResponseMIMEType and ResponseJSONSchema ask for structured output ("application/json").
	ResponseMIMEType   string
	ResponseJSONSchema any
	// Validate checks an output; a failure is a quality failure. Nil accepts every output.
	Validate func(output string) error
	// QualityRetry changes the generation config after Validate rejected an output; nil uses
	// prompts.LowerTemperature. A rejected output is never retried under the same conditions.
	QualityRetry func(task.GenConfig) task.GenConfig
	// MaxCostUSD refuses calls whose estimate exceeds it; 0 means no limit.
	MaxCostUSD float64
	// Tier is the service tier asked for: TierStandard ("" too), TierFlex or TierPriority.
	Tier Tier
	// CachedContent names an explicit context cache of SystemInstruction made for CacheModel
	// (and of Files too when FilesCached: they come before the prompt): a call to that model
	// sends the cache instead of them; a call to any other model of the chain (a fallback), or
	// one after the cache was found gone, sends the whole prompt.
	CachedContent, CacheModel string
	FilesCached               bool
	// OnPartial, when set, streams the call (streamGenerateContent) and receives the text
	// generated so far after each chunk. It must not block: the stream waits for it.
	OnPartial func(text string)
	// Admit, when set, admits each model call before it is made (a tenant's share of the
	// quota), given the call's worst case: its estimated prompt plus its largest output. It may
	// wait; an error, its context's as a rule, ends Generate with no call. The function it
	// returns receives what the call used: its usageMetadata's total tokens, its estimate when
	// in doubt, 0 when it was answered with an error or not sent (its context ended first).
	Admit func(ctx context.Context, tokens int64) (used func(tokens int64), err error)
}

// Result is what Generate spent and, on success, produced. It is returned with errors too, so that
// tokens and cost already paid are always recorded.
type Result struct {
	Text     string
	Model    string
	Degraded bool       // answered by a fallback model
	Usage    task.Usage // tokens the model reported, summed over every call
	InDoubt  task.Usage // estimated tokens of calls that ended in a network error
	Calls    int        // model calls made
	CostUSD  float64
	// Tier is the tier that served the last answered call (usageMetadata.trafficType).
	Tier Tier
	// CacheLost means the request's context cache was gone (expired or deleted): the calls went
	// with the whole prompt.
	CacheLost bool
	// Attempts records every model call made, in order.
	Attempts []Attempt
}
