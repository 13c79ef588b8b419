package gemini

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/backoff"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Clock tells the time and waits. Tests inject one that records the waits instead of sleeping.
type Clock interface {
	Now() time.Time
	// Sleep waits d or until ctx ends, whichever comes first, and returns ctx.Err() in the latter case.
	Sleep(ctx context.Context, d time.Duration) error
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Option configures a Client.
type Option func(*Client)

// WithBreakerStore records breaker state changes (breakers/{model}).
func WithBreakerStore(s BreakerStore) Option { return func(c *Client) { c.breakerStore = s } }

// WithAlerts receives an alert when a model's breaker opens; key is stable per model, for cooldowns.
func WithAlerts(f func(ctx context.Context, key, msg string)) Option {
	return func(c *Client) { c.alert = f }
}

// WithClock replaces the wall clock.
func WithClock(clk Clock) Option { return func(c *Client) { c.clock = clk } }

// WithRand replaces the jitter source; f returns a number in [0, 1) and must be safe for concurrent use.
func WithRand(f func() float64) Option { return func(c *Client) { c.rand = f } }

// WithLogger sets the logger (the default discards).
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.log = l } }

// WithHTTPClient sets the HTTP client the SDK uses (with the Gemini API backend, one keeping
// idleConnsPerHost idle connections otherwise).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.httpClient = h } }

// idleConnsPerHost is how many idle connections to the model's host the Gemini API backend
// keeps, as Google's own transport does for Vertex AI (cloud.google.com/go/auth/httptransport).
// The SDK's default client keeps net/http's two: over HTTP/1.1 (a proxy, an endpoint without
// HTTP/2, the fake), every call beyond two at once closed its connection when it answered, and
// the next call dialed a new one while holding a model-call slot.
const idleConnsPerHost = 100

// pooledClient is the HTTP client of the Gemini API backend when none is given.
func pooledClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idleConnsPerHost
	return &http.Client{Transport: tr}
}

// Client calls Gemini under the policy of its Config. It is safe for concurrent use.
type Client struct {
	cfg          Config
	models       *genai.Models
	batches      *genai.Batches
	caches       *genai.Caches
	files        *genai.Files
	breakerStore BreakerStore
	alert        func(ctx context.Context, key, msg string)
	clock        Clock
	rand         func() float64
	log          *slog.Logger
	httpClient   *http.Client
	attemptHook  AttemptHook

	mu       sync.Mutex
	breakers map[string]*breaker
	limiters map[string]*limiter
	share    float64 // of each model's RPM and TPM: Config.InstanceShare, then SetInstanceShare's
}

// New returns a Client with the SDK's own retries off: every retry is this package's decision.
func New(ctx context.Context, cfg Config, opts ...Option) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Client{
		cfg:      cfg,
		clock:    wallClock{},
		rand:     rand.Float64,
		log:      slog.New(slog.DiscardHandler),
		breakers: map[string]*breaker{},
		limiters: map[string]*limiter{},
		share:    cfg.InstanceShare,
	}
	for _, o := range opts {
		o(c)
	}
	one := int32(1)
	cc := &genai.ClientConfig{
		HTTPClient: c.httpClient,
		// One attempt per SDK call: the SDK's own retries ignore RetryInfo and our budget.
		HTTPOptions: genai.HTTPOptions{RetryOptions: &genai.HTTPRetryOptions{Attempts: &one}},
	}
	switch cfg.Backend {
	case BackendVertex:
		cc.Backend, cc.Project, cc.Location = genai.BackendVertexAI, cfg.Project, cfg.Location
	default:
		cc.Backend, cc.APIKey, cc.HTTPOptions.BaseURL = genai.BackendGeminiAPI, cfg.APIKey, cfg.BaseURL
		if cc.HTTPClient == nil {
			cc.HTTPClient = pooledClient()
		}
		if cc.APIKey == "" {
			cc.APIKey = "fake" // a fake at BaseURL (Validate allows no key only then) ignores it
		}
	}
	g, err := genai.NewClient(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("gemini client: %w", err)
	}
	c.models, c.batches, c.caches, c.files = g.Models, g.Batches, g.Caches, g.Files
	return c, nil
}

func (c *Client) breaker(model string) *breaker {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.breakers[model]
	if !ok {
		b = newBreaker(model, c.cfg.Breaker)
		c.breakers[model] = b
	}
	return b
}

func (c *Client) limiter(model string) *limiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.limiters[model]
	if !ok {
		l = &limiter{}
		if r, ok := c.cfg.RPM[model]; ok {
			l.requests = newBucket(r, c.cfg.RateWindow, c.share, c.cfg.RateHeadroom)
		}
		if t, ok := c.cfg.TPM[model]; ok {
			l.tokens = newBucket(t, c.cfg.RateWindow, c.share, c.cfg.RateHeadroom)
		}
		c.limiters[model] = l
	}
	return l
}

// SetInstanceShare makes share the fraction of each model's RPM and TPM this instance may use
// from now on (Config.InstanceShare): the autoscaler changes it as the pool's instance count
// changes. The limiters start again from their burst; a share outside (0, 1] is ignored.
func (c *Client) SetInstanceShare(share float64) {
	if !(share > 0 && share <= 1) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.share == share {
		return
	}
	c.share = share
	c.limiters = map[string]*limiter{}
}

// Available reports whether any model of the chain could take a call now: false when every
// breaker is open and still cooling down, or half-open with its probe in flight. The worker parks
// a task when its chain is not.
func (c *Client) Available(models []string) bool {
	if len(models) == 0 {
		models = c.cfg.Models
	}
	now := c.clock.Now()
	for _, m := range models {
		if c.breaker(m).available(now) {
			return true
		}
	}
	return false
}

// NextCall is the earliest time a model of the chain may take a call: now when one can, else the
// end of the first cooldown or probe in flight. A task parked on the chain need not wait longer
// to be looked at again.
func (c *Client) NextCall(models []string) time.Time {
	if len(models) == 0 {
		models = c.cfg.Models
	}
	now := c.clock.Now()
	var at time.Time
	for i, m := range models {
		if t := c.breaker(m).nextCall(now); i == 0 || t.Before(at) {
			at = t
		}
	}
	return at
}

// ObserveBreaker adopts a breaker state stored by any instance (breakers/{model}), when it is
// newer than this instance's: an outage one instance saw holds the others' calls back, one probe
// serves them all, and a recovery closes every instance's breaker at once.
func (c *Client) ObserveBreaker(st BreakerStatus) { c.breaker(st.Model).observe(st) }

// EstimateTokens is the cheap token estimate of a text used before a call: about four bytes a token.
func EstimateTokens(s string) int64 { return int64(len(s)+3) / 4 }

func promptTokens(req Request) int64 {
	n := EstimateTokens(req.SystemInstruction) + EstimateTokens(req.Prompt)
	for _, f := range req.Files {
		n += FileTokens(f)
	}
	return n
}

func (p Pricing) chain(req Request) []string {
	if len(req.Models) > 0 {
		return req.Models
	}
	return p.Models
}

func (p Pricing) maxOutput(cfg task.GenConfig) int64 {
	if cfg.MaxOutputTokens != nil && *cfg.MaxOutputTokens > 0 {
		return int64(*cfg.MaxOutputTokens)
	}
	return p.DefaultMaxOutputTokens
}

// Estimate returns the worst case of one call before any is made: the estimated prompt plus the
// largest output, priced at the most expensive model of the chain, on the standard tier (the
// Priority tier for a priority request). It is what max_cost_usd and
// the Regenerate button's estimate compare against. A model missing from the price table costs 0.
func (p Pricing) Estimate(req Request) (tokens int64, costUSD float64) {
	out := p.maxOutput(req.Config)
	for _, m := range p.chain(req) {
		costUSD = max(costUSD, p.worstCall(m, req, out))
	}
	return promptTokens(req) + out, costUSD
}

// Estimate prices req with the client's Pricing (Pricing.Estimate).
func (c *Client) Estimate(req Request) (tokens int64, costUSD float64) { return c.cfg.Estimate(req) }

// MaxSpend is the most one Generate of req can spend: its attempt budget of calls — answered,
// rejected by the validator, or in doubt — each at Estimate's worst case, and no more than req's
// max_cost_usd, past which Generate makes no further call. A tenant's budget reserves it for the
// call, not one call's estimate.
func (c Config) MaxSpend(req Request) float64 {
	_, one := c.Estimate(req)
	worst := float64(c.MaxAttempts) * one
	if req.MaxCostUSD > 0 {
		worst = min(worst, req.MaxCostUSD)
	}
	return worst
}

// MaxSpend is Config.MaxSpend under the client's configuration.
func (c *Client) MaxSpend(req Request) float64 { return c.cfg.MaxSpend(req) }

// backoff returns the wait before retry n (1-based) of one model: full jitter over an exponential
// ceiling, never shorter than the server's RetryInfo delay.
func (c *Client) backoff(n int, retryAfter time.Duration) time.Duration {
	p := backoff.Policy{Base: c.cfg.BackoffBase, Max: c.cfg.BackoffMax, Jitter: backoff.Full}
	return max(p.Delay(n, c.rand), retryAfter)
}

// Generate runs req under the policy: one attempt budget across the chain; per model, retries of
// transient and network failures with full-jitter backoff honouring RetryInfo; then the next model
// (Degraded). A model whose breaker is open is skipped; when every one is, Generate returns
// ErrUnavailable without a call. A flex request the Flex tier shed ends at once in a Shed error,
// the breaker untouched. An output the validator rejects is retried with changed
// conditions (QualityRetry, else a lower temperature) and ends in a Quality error. A permanent
// failure ends after one call. When ctx ends, Generate returns ctx.Err(). The Result counts what
// was spent in every case.
func (c *Client) Generate(ctx context.Context, req Request) (Result, error) {
	var res Result
	models := c.cfg.chain(req)
	if req.MaxCostUSD > 0 {
		if _, est := c.Estimate(req); est > req.MaxCostUSD {
			return res, &Error{Class: Budget, Model: models[0], Err: fmt.Errorf("estimated $%.6f exceeds max_cost_usd $%.6f", est, req.MaxCostUSD)}
		}
	}
	cfg := req.Config
	budget, quality := c.cfg.MaxAttempts, c.cfg.QualityAttempts
	var last *Error
	// waits follows the servers' RetryInfo delays and whether every call was turned away by a
	// rate limit: both go to the caller with the last error.
	var waits retryWaits
	refused := false // the last breaker asked refused the call
	for i, model := range models {
		br := c.breaker(model)
		retrying := false // the previous call on this model failed: back off first
		for failures := 0; failures < c.cfg.ModelAttempts && budget > 0; {
			if retrying {
				if last.RetryAfter > c.cfg.MaxRetryWait {
					break // not worth holding the task here: the next model, or the caller's backoff
				}
				if err := c.clock.Sleep(ctx, c.backoff(failures, last.RetryAfter)); err != nil {
					return res, err
				}
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
			ok, gen, ch := br.allow(c.clock.Now())
			if ok && ch != nil && !c.report(ctx, br, ch) {
				ok = false // another instance took the probe, or moved the breaker first
			}
			if refused = !ok; refused {
				break
			}
			if req.MaxCostUSD > 0 {
				if one := c.cfg.worstCall(model, req, c.cfg.maxOutput(cfg)); res.CostUSD+one > req.MaxCostUSD {
					br.record(c.clock.Now(), gen, outcomeNeutral)
					return res, &Error{Class: Budget, Model: model, Err: fmt.Errorf("spent $%.6f; another call could exceed max_cost_usd $%.6f", res.CostUSD, req.MaxCostUSD)}
				}
			}
			budget--
			text, f, err := c.attempt(ctx, c.cfg.MaxAttempts-budget, model, req, cfg, &res)
			if err != nil {
				br.record(c.clock.Now(), gen, outcomeNeutral)
				return res, err
			}
			if f == nil {
				c.report(ctx, br, br.record(c.clock.Now(), gen, outcomeSuccess))
				if req.Validate != nil {
					if verr := req.Validate(text); verr != nil {
						quality--
						waits.answered = true
						last = &Error{Class: Quality, Code: http.StatusOK, Model: model, Err: verr}
						if quality <= 0 || budget <= 0 {
							return res, last
						}
						cfg, retrying = c.qualityRetry(req, cfg), false
						c.log.InfoContext(ctx, "output rejected; retrying with changed conditions", "task_id", req.TaskID, "model", model, "error", verr)
						continue
					}
				}
				res.Text, res.Model, res.Degraded = text, model, i > 0
				return res, nil
			}
			last = &Error{Class: f.class, Code: f.code, Model: model, RetryAfter: f.retryAfter, Err: f.err}
			waits.failed(c.clock.Now(), f)
			if f.class == Permanent || f.class == Shed {
				c.report(ctx, br, br.record(c.clock.Now(), gen, outcomeNeutral))
				return res, last
			}
			c.report(ctx, br, br.record(c.clock.Now(), gen, outcomeFailure))
			c.log.WarnContext(ctx, "model call failed", "task_id", req.TaskID, "model", model, "class", string(f.class), "code", f.code, "error", f.err)
			failures, retrying = failures+1, true
		}
		if budget <= 0 {
			break
		}
	}
	switch {
	case last == nil:
		return res, fmt.Errorf("%w: %s", ErrUnavailable, strings.Join(models, ", "))
	case refused:
		// Every model was tried or refused, and the last refused: the chain is unavailable now,
		// whatever its breakers say a moment later. The caller waits for the chain without
		// spending an attempt.
		return res, fmt.Errorf("%w: %s (last failure: %w)", ErrUnavailable, strings.Join(models, ", "), last)
	}
	last.RetryAfter, last.RateLimited = waits.after(c.clock.Now())
	return res, last
}

// retryWaits follows the RetryInfo delays of one Generate's calls.
type retryWaits struct {
	until      time.Time // the latest end of a delay a server asked for
	failures   int
	rateLimits int  // failures that were 429s with a delay
	answered   bool // a model answered (an output the validator rejected)
}

func (w *retryWaits) failed(now time.Time, f *failure) {
	w.failures++
	if f.retryAfter <= 0 {
		return
	}
	if f.code == http.StatusTooManyRequests {
		w.rateLimits++
	}
	if end := now.Add(f.retryAfter); end.After(w.until) {
		w.until = end
	}
}

// after returns what is left at now of the longest delay, and whether every failure was a
// rate limit with a delay.
func (w *retryWaits) after(now time.Time) (time.Duration, bool) {
	return max(w.until.Sub(now), 0), !w.answered && w.failures > 0 && w.rateLimits == w.failures
}

func (c *Client) qualityRetry(req Request, cfg task.GenConfig) task.GenConfig {
	if req.QualityRetry != nil {
		return req.QualityRetry(cfg)
	}
	return prompts.LowerTemperature(cfg)
}

// call makes one model call and adds what it spent to res. A nil failure and nil error mean the
// model answered with text; a non-nil error means ctx ended.
func (c *Client) call(ctx context.Context, model string, req Request, cfg task.GenConfig, res *Result) (string, *failure, error) {
	prompt := promptTokens(req)
	used := func(int64) {}
	if req.Admit != nil {
		u, err := req.Admit(ctx, prompt+c.cfg.maxOutput(cfg))
		if err != nil {
			return "", nil, err
		}
		used = u
	}
	lim := c.limiter(model)
	resv, err := lim.acquire(ctx, c.clock, prompt)
	if err != nil {
		used(0)
		return "", nil, err
	}
	timeout := c.cfg.CallTimeout
	if req.Tier == TierFlex {
		timeout = c.cfg.FlexCallTimeout
	}
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res.Calls++
	gc, cached := c.genaiConfig(req, cfg), req.CachedContent != "" && model == req.CacheModel && !res.CacheLost
	sent := req
	if cached {
		gc.CachedContent, gc.SystemInstruction = req.CachedContent, nil
		if req.FilesCached {
			sent.Files = nil
		}
	}
	resp, err := c.generateContent(callCtx, model, sent, gc)
	if err != nil {
		if ctx.Err() != nil {
			used(c.spendInDoubt(model, req, cfg, res))
			return "", nil, ctx.Err()
		}
		f := classify(err)
		if req.Tier == TierFlex && f.code == http.StatusServiceUnavailable {
			f.class = Shed
		}
		switch {
		case f.class == Network:
			used(c.spendInDoubt(model, req, cfg, res))
		case f.code == http.StatusTooManyRequests:
			used(0)
			lim.throttled(c.clock)
			lim.settle(c.clock, resv, 0)
		default:
			used(0)
			lim.settle(c.clock, resv, 0)
		}
		if cached && (f.code == http.StatusForbidden || f.code == http.StatusNotFound) {
			// The context cache expired or was deleted: the same call goes again with the whole prompt.
			res.CacheLost = true
			return c.call(ctx, model, req, cfg, res)
		}
		return "", &f, nil
	}
	u := usageOf(resp)
	used(u.TotalTokens)
	res.Usage = res.Usage.Add(u)
	res.Tier = servedTier(resp.UsageMetadata)
	res.CostUSD += c.cfg.price(model).Bill(u, res.Tier)
	lim.settle(c.clock, resv, u.PromptTokens)
	lim.succeeded(c.clock)
	if berr := blocked(resp); berr != nil {
		return "", &failure{class: Permanent, code: http.StatusOK, err: berr}, nil
	}
	return resp.Text(), nil, nil
}

// spendInDoubt records a call that may have been billed without telling us: the estimated prompt
// and expected output count as in doubt, and their cost is counted (never under-count spend). It
// returns the tokens counted.
func (c *Client) spendInDoubt(model string, req Request, cfg task.GenConfig, res *Result) int64 {
	prompt := promptTokens(req)
	out := min(c.cfg.ExpectedOutputTokens, c.cfg.maxOutput(cfg))
	res.InDoubt = res.InDoubt.Add(task.Usage{PromptTokens: prompt, OutputTokens: out, TotalTokens: prompt + out})
	res.CostUSD += c.cfg.worstCall(model, req, out)
	return prompt + out
}

// worstCall is the most one call of req to model may cost with out output tokens, none of its
// prompt cached: at the standard tier (a flex or batch call may be served there), or the
// Priority tier's for a priority request; its audio at the tier's audio rate.
func (p Pricing) worstCall(model string, req Request, out int64) float64 {
	tier := TierStandard
	if req.Tier == TierPriority {
		tier = TierPriority
	}
	return p.price(model).Bill(task.Usage{PromptTokens: promptTokens(req), AudioTokens: audioTokens(req), OutputTokens: out}, tier)
}

func usageOf(resp *genai.GenerateContentResponse) task.Usage {
	m := resp.UsageMetadata
	if m == nil {
		return task.Usage{}
	}
	out := int64(m.CandidatesTokenCount) + int64(m.ThoughtsTokenCount)
	u := task.Usage{PromptTokens: int64(m.PromptTokenCount), OutputTokens: out, TotalTokens: int64(m.TotalTokenCount),
		CachedTokens: int64(m.CachedContentTokenCount)}
	addModalities(&u, m.PromptTokensDetails)
	if u.TotalTokens == 0 {
		u.TotalTokens = u.PromptTokens + u.OutputTokens
	}
	return u
}

func (c *Client) genaiConfig(req Request, cfg task.GenConfig) *genai.GenerateContentConfig {
	off := false
	gc := &genai.GenerateContentConfig{
		// A continuation would resend the request without asking us: never.
		AutomaticContinuation: &off,
		ResponseMIMEType:      req.ResponseMIMEType,
		ResponseJsonSchema:    req.ResponseJSONSchema,
	}
	switch req.Tier {
	case TierPriority:
		gc.ServiceTier = genai.ServiceTierPriority
	case TierFlex:
		gc.ServiceTier = genai.ServiceTierFlex
	}
	if req.SystemInstruction != "" {
		gc.SystemInstruction = genai.NewContentFromText(req.SystemInstruction, genai.RoleUser)
	}
	if cfg.Temperature != nil {
		t := float32(*cfg.Temperature)
		gc.Temperature = &t
	}
	if cfg.TopP != nil {
		p := float32(*cfg.TopP)
		gc.TopP = &p
	}
	if cfg.TopK != nil {
		k := float32(*cfg.TopK)
		gc.TopK = &k
	}
	if cfg.MaxOutputTokens != nil {
		gc.MaxOutputTokens = *cfg.MaxOutputTokens
	}
	return gc
}

// report stores a breaker change and raises an alert when a breaker opens. It reports whether
// the change stands: false when another instance changed the breaker first (the breaker then
// gives the change up and follows the stored state).
func (c *Client) report(ctx context.Context, br *breaker, ch *BreakerChange) bool {
	if ch == nil {
		return true
	}
	if c.breakerStore != nil {
		err := c.breakerStore.SaveBreaker(context.WithoutCancel(ctx), *ch)
		switch {
		case errors.Is(err, ErrBreakerMoved):
			br.moved(ch)
			c.log.InfoContext(ctx, "breaker changed by another instance first", "model", ch.Model, "to", string(ch.To), "generation", ch.Generation)
			return false
		case err != nil:
			// Not shared: this instance goes on with its own breaker, as without a store.
			c.log.ErrorContext(ctx, "save breaker", "model", ch.Model, "error", err)
		}
	}
	c.log.WarnContext(ctx, "breaker changed", "model", ch.Model, "from", string(ch.From), "to", string(ch.To), "reason", ch.Reason, "generation", ch.Generation)
	if c.alert != nil && ch.From == BreakerClosed && ch.To == BreakerOpen {
		c.alert(context.WithoutCancel(ctx), "breaker:"+ch.Model, fmt.Sprintf("model %s breaker open: %s; traffic moves to the next model until %s", ch.Model, ch.Reason, ch.RetryAt.Format(time.RFC3339)))
	}
	return true
}
