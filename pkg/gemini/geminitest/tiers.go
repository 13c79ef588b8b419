package geminitest

import (
	"net/http"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Shedding is how a model's flex tier sheds load: a flex request it sheds is answered 503
// UNAVAILABLE before generating (and not billed), as the Flex tier's best-effort capacity does.
// Standard requests are never shed.
type Shedding struct {
	// Fraction of flex requests shed, drawn from the fake's seeded random source.
	Fraction float64
	// Func, when set, decides instead of Fraction: true sheds the request.
	Func func(r Request) bool
}

// ImplicitCaching is a model's implicit context caching (the 2.5 models cache repeated prompt
// prefixes by themselves): a request whose system instruction has at least MinTokens tokens and
// was seen within TTL hits the cache with probability HitRate, and its system instruction's
// tokens are reported as cachedContentTokenCount. The zero value caches nothing.
type ImplicitCaching struct {
	MinTokens int64
	HitRate   float64
	// TTL is how long a prefix stays cached after it was last seen; 0 means five minutes.
	TTL time.Duration
}

// SetShedding sets how a model's flex tier sheds; the zero Shedding sheds nothing.
func (f *Fake) SetShedding(model string, s Shedding) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shedding[model] = s
}

// SetPriorityFallback makes a model serve fraction of its priority requests on the standard
// tier, as Gemini may under load (drawn from the fake's seeded random source); it says so in
// usageMetadata.trafficType and bills them at the standard price. 0, the default, serves every
// priority request on the Priority tier.
func (f *Fake) SetPriorityFallback(model string, fraction float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fallback[model] = fraction
}

// serveTier decides, under the lock, the tier a priority request is served on.
func (f *Fake) serveTier(r *Request) {
	if r.Tier != TierPriority {
		return
	}
	if fraction, ok := pick(f.fallback, r.Model); ok && f.rng.Float64() < fraction {
		r.Tier = TierStandard
	}
}

// SetImplicitCaching sets a model's implicit caching; the zero value turns it off.
func (f *Fake) SetImplicitCaching(model string, c ImplicitCaching) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.implicit[model] = c
}

// shed decides, under the lock, whether a flex request is shed, and returns its answer.
func (f *Fake) shed(r Request) *apiFailure {
	if r.Tier != TierFlex {
		return nil
	}
	s, ok := pick(f.shedding, r.Model)
	if !ok {
		return nil
	}
	if s.Func != nil && !s.Func(r) || s.Func == nil && !(f.rng.Float64() < s.Fraction) {
		return nil
	}
	return &apiFailure{code: http.StatusServiceUnavailable, model: r.Model,
		message: "The flex tier has no capacity for this request right now. Please retry later, or use the standard tier."}
}

// implicitHit applies implicit caching to a request without an explicit cache, under the lock.
func (f *Fake) implicitHit(r *Request, now time.Time) {
	c, ok := pick(f.implicit, r.Model)
	if !ok || r.CachedContent != "" || r.SystemInstruction == "" {
		return
	}
	n := tokens(r.SystemInstruction)
	if n < c.MinTokens || c.HitRate <= 0 {
		return
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = 5 * time.Minute
	}
	key := r.Model + "\x00" + r.SystemInstruction
	last, seen := f.seen[key]
	f.seen[key] = now
	if seen && now.Sub(last) < ttl && f.rng.Float64() < c.HitRate {
		r.CachedTokens = n
	}
}

// usageOf is what a finished generation reports and bills.
func usageOf(r Request, reply Reply) task.Usage {
	files := func(m string) int64 { return r.fileTokens[m] + r.cachedFileTokens[m] }
	u := task.Usage{PromptTokens: r.PromptTokens(), OutputTokens: tokens(reply.Text), CachedTokens: r.CachedTokens,
		ImageTokens: files("IMAGE"), AudioTokens: files("AUDIO"), VideoTokens: files("VIDEO"), DocumentTokens: files("DOCUMENT")}
	u.TotalTokens = u.PromptTokens + u.OutputTokens
	return u
}

// finalize fills what Gemini adds to every answer: finishReason STOP unless another was
// scripted, no text for a blocked prompt.
func (reply Reply) finalize() Reply {
	if reply.FinishReason == "" {
		reply.FinishReason = "STOP"
		if reply.ContinuationToken != "" {
			reply.FinishReason = "CONTINUATION"
		}
	}
	if reply.BlockReason != "" {
		reply.Text = ""
	}
	return reply
}

// wireUsageOf is the usageMetadata of u served on tier: trafficType says which tier served an
// online call (a batch response carries none).
func wireUsageOf(u task.Usage, tier string) *wireUsage {
	w := &wireUsage{
		PromptTokenCount:        u.PromptTokens,
		CachedContentTokenCount: u.CachedTokens,
		CandidatesTokenCount:    u.OutputTokens,
		TotalTokenCount:         u.TotalTokens,
		PromptTokensDetails:     modalityDetails(u),
	}
	if u.CachedTokens > 0 {
		w.CacheTokensDetails = []wireModalityUsed{{Modality: "TEXT", TokenCount: u.CachedTokens}}
	}
	switch tier {
	case TierFlex:
		w.TrafficType = trafficFlex
	case TierPriority:
		w.TrafficType = trafficPriority
	case TierStandard:
		w.TrafficType = trafficOnDemand
	}
	return w
}

// badRequest is the 400 INVALID_ARGUMENT answer of a decoding error.
func badRequest(err error) apiFailure {
	return apiFailure{code: http.StatusBadRequest, message: strings.TrimPrefix(err.Error(), errBadRequest.Error()+": ")}
}

// modalityDetails is promptTokensDetails of u: its file tokens by modality, the rest as text.
func modalityDetails(u task.Usage) []wireModalityUsed {
	text := u.PromptTokens - u.ImageTokens - u.AudioTokens - u.VideoTokens - u.DocumentTokens
	out := []wireModalityUsed{{Modality: "TEXT", TokenCount: text}}
	for _, m := range []wireModalityUsed{{"IMAGE", u.ImageTokens}, {"AUDIO", u.AudioTokens}, {"VIDEO", u.VideoTokens}, {"DOCUMENT", u.DocumentTokens}} {
		if m.TokenCount > 0 {
			out = append(out, m)
		}
	}
	return out
}
