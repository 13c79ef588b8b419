package gemini

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Backends.
const (
	BackendGemini = "gemini"
	BackendVertex = "vertex"
)

// DefaultModelChain is the fallback chain used when neither the request nor the family names one.
var DefaultModelChain = []string{"gemini-2.5-flash", "gemini-2.5-flash-lite"}

// BreakerConfig sets when a model's circuit breaker opens and how it probes recovery.
type BreakerConfig struct {
	// ConsecutiveFailures opens the breaker after that many failures in a row.
	ConsecutiveFailures int
	// Window and FailureRatio open the breaker when more than FailureRatio of the calls in the last
	// Window failed, once at least MinVolume calls were made in it.
	Window       time.Duration
	FailureRatio float64
	MinVolume    int
	// Cooldown is how long an open breaker stays open before one half-open probe may pass.
	Cooldown time.Duration
}

// Pricing is what prices a call before it is made (Estimate): the default chain, the price table
// and the output assumed when a request sets no bound. It needs no model credentials, so a
// service that only prices calls (the dlqnotifier's Regenerate button) reads it alone, with
// genbox's internal/geminienv.Pricing, and prices exactly as the worker does.
type Pricing struct {
	// Models is the default fallback chain.
	Models []string
	// Prices is the price table, USD per million tokens, merged over DefaultPrices.
	Prices map[string]Price
	// DefaultMaxOutputTokens is the output bound assumed by Estimate when a request sets none.
	DefaultMaxOutputTokens int64
}

// DefaultPricing returns the default chain and the built-in price table.
func DefaultPricing() Pricing {
	return Pricing{Models: slices.Clone(DefaultModelChain), DefaultMaxOutputTokens: 8192}
}

// Validate reports a pricing that cannot work, naming its variable.
func (p Pricing) Validate() error {
	if len(p.Models) == 0 {
		return errors.New("GENBOX_MODEL_CHAIN: no model")
	}
	return nil
}

// Config is the model-call policy: start from DefaultConfig; a Config built by hand must pass
// Validate.
type Config struct {
	Backend  string // "gemini" (Gemini API) or "vertex" (Vertex AI)
	APIKey   string // GEMINI_API_KEY, for the Gemini API backend
	BaseURL  string // GOOGLE_GEMINI_BASE_URL: the SDK's own Gemini API endpoint override (a fake in tests)
	Project  string // GOOGLE_CLOUD_PROJECT, for Vertex AI
	Location string // GOOGLE_CLOUD_LOCATION, for Vertex AI

	// Pricing holds the default chain and what Estimate prices calls with.
	Pricing
	// MaxAttempts is the attempt budget of one Generate across the whole chain.
	MaxAttempts int
	// ModelAttempts bounds the attempts on one model before falling back to the next.
	ModelAttempts int
	// QualityAttempts bounds the calls spent on outputs that fail the validator (first call included).
	QualityAttempts int
	// BackoffBase and BackoffMax shape the full-jitter exponential backoff between retries.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MaxRetryWait is the longest server-requested delay (RetryInfo) worth waiting in process;
	// a longer one moves to the next model, or returns the error with RetryAfter set.
	MaxRetryWait time.Duration
	// CallTimeout bounds one model call; hitting it is a network error (the call may be billed).
	CallTimeout time.Duration
	// FlexCallTimeout bounds one flex call instead: the Flex tier's latency target is minutes.
	FlexCallTimeout time.Duration

	// RPM and TPM are each model's requests and input tokens per minute (Gemini's quotas count
	// prompt tokens) for the whole deployment; a model absent from a map is not limited.
	RPM map[string]float64
	TPM map[string]float64
	// RateWindow is the period RPM and TPM are counted over: a minute against the real API,
	// shorter against a fake in tests.
	RateWindow time.Duration
	// InstanceShare is the fraction of RPM and TPM this instance may use (1/instances).
	InstanceShare float64
	// RateHeadroom keeps the limiters just under the quota, so that boundary effects of the
	// provider's window never turn into a 429.
	RateHeadroom float64
	// ExpectedOutputTokens is the output counted, with the estimated prompt, for a call that ended
	// in a network error (in doubt: it may have been billed).
	ExpectedOutputTokens int64

	Breaker BreakerConfig
}

// DefaultConfig returns the policy's defaults: a Config for the Gemini API backend that needs
// only its credentials (APIKey, or BaseURL for a compatible endpoint) to pass Validate. The
// library reads no environment; genbox's services read theirs over these defaults.
func DefaultConfig() Config {
	return Config{
		Backend:              BackendGemini,
		Pricing:              DefaultPricing(),
		MaxAttempts:          8,
		ModelAttempts:        4,
		QualityAttempts:      3,
		BackoffBase:          500 * time.Millisecond,
		BackoffMax:           20 * time.Second,
		MaxRetryWait:         30 * time.Second,
		CallTimeout:          2 * time.Minute,
		FlexCallTimeout:      15 * time.Minute,
		RateWindow:           time.Minute,
		InstanceShare:        1,
		RateHeadroom:         0.97,
		ExpectedOutputTokens: 512,
		Breaker: BreakerConfig{
			ConsecutiveFailures: 5,
			Window:              5 * time.Minute,
			FailureRatio:        0.5,
			MinVolume:           10,
			Cooldown:            15 * time.Second,
		},
	}
}

// Validate reports the first setting that cannot work, naming its variable.
func (c Config) Validate() error {
	if err := c.Pricing.Validate(); err != nil {
		return err
	}
	switch {
	case c.Backend != BackendGemini && c.Backend != BackendVertex:
		return fmt.Errorf("GENBOX_GEMINI_BACKEND: %q is neither %q nor %q", c.Backend, BackendGemini, BackendVertex)
	case c.Backend == BackendGemini && c.APIKey == "" && c.BaseURL == "":
		return errors.New("GEMINI_API_KEY: required by the gemini backend unless GOOGLE_GEMINI_BASE_URL names a fake")
	case c.Backend == BackendVertex && (c.Project == "" || c.Location == ""):
		return errors.New("GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION: required by the vertex backend")
	case c.MaxAttempts < 1:
		return fmt.Errorf("GENBOX_MAX_ATTEMPTS: %d, want at least 1", c.MaxAttempts)
	case c.ModelAttempts < 1:
		return fmt.Errorf("GENBOX_MODEL_ATTEMPTS: %d, want at least 1", c.ModelAttempts)
	case c.QualityAttempts < 1:
		return fmt.Errorf("GENBOX_QUALITY_ATTEMPTS: %d, want at least 1", c.QualityAttempts)
	case c.BackoffBase <= 0 || c.BackoffMax < c.BackoffBase:
		return fmt.Errorf("GENBOX_BACKOFF_BASE, GENBOX_BACKOFF_MAX: want 0 < base (%s) <= max (%s)", c.BackoffBase, c.BackoffMax)
	case c.MaxRetryWait < 0:
		return fmt.Errorf("GENBOX_MAX_RETRY_WAIT: %s is negative", c.MaxRetryWait)
	case c.CallTimeout <= 0:
		return fmt.Errorf("GENBOX_CALL_TIMEOUT: %s, want > 0", c.CallTimeout)
	case c.FlexCallTimeout <= 0:
		return fmt.Errorf("GENBOX_FLEX_CALL_TIMEOUT: %s, want > 0", c.FlexCallTimeout)
	case c.RateWindow <= 0:
		return fmt.Errorf("GENBOX_RATE_WINDOW: %s, want > 0", c.RateWindow)
	case !(c.InstanceShare > 0 && c.InstanceShare <= 1):
		return fmt.Errorf("GENBOX_INSTANCE_SHARE: %g, want in (0, 1]", c.InstanceShare)
	case !(c.RateHeadroom > 0 && c.RateHeadroom <= 1):
		return fmt.Errorf("GENBOX_RATE_HEADROOM: %g, want in (0, 1]", c.RateHeadroom)
	case c.Breaker.ConsecutiveFailures < 1:
		return fmt.Errorf("GENBOX_BREAKER_FAILURES: %d, want at least 1", c.Breaker.ConsecutiveFailures)
	case c.Breaker.Window <= 0:
		return fmt.Errorf("GENBOX_BREAKER_WINDOW: %s, want > 0", c.Breaker.Window)
	case !(c.Breaker.FailureRatio > 0 && c.Breaker.FailureRatio <= 1):
		return fmt.Errorf("GENBOX_BREAKER_FAILURE_RATIO: %g, want in (0, 1]", c.Breaker.FailureRatio)
	case c.Breaker.Cooldown <= 0:
		return fmt.Errorf("GENBOX_BREAKER_COOLDOWN: %s, want > 0", c.Breaker.Cooldown)
	}
	return nil
}

// LongestGenerate bounds how long one Generate can take under c: its attempt budget of calls,
// each up to CallTimeout, and a wait before every retry, up to the longer of BackoffMax and
// MaxRetryWait (a longer RetryInfo delay is not waited for in process). Time spent queued in the
// rate limiters comes on top.
func (c Config) LongestGenerate() time.Duration {
	n := time.Duration(c.MaxAttempts)
	return n*c.CallTimeout + (n-1)*max(c.BackoffMax, c.MaxRetryWait)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
