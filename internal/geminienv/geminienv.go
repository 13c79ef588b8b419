// Package geminienv reads the model-call policy of pkg/gemini from genbox's environment
// variables: pkg/gemini itself reads none, so a library user passes a gemini.Config, and the
// services read theirs here, over gemini.DefaultConfig.
package geminienv

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

// Config reads the policy. It calls getenv for every variable it knows:
// GEMINI_API_KEY, GOOGLE_GEMINI_BASE_URL, GENBOX_GEMINI_BACKEND (gemini|vertex),
// GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION (vertex), GENBOX_MODEL_CHAIN ("a,b"),
// GENBOX_MAX_ATTEMPTS, GENBOX_MODEL_ATTEMPTS, GENBOX_QUALITY_ATTEMPTS, GENBOX_BACKOFF_BASE,
// GENBOX_BACKOFF_MAX, GENBOX_MAX_RETRY_WAIT, GENBOX_CALL_TIMEOUT, GENBOX_FLEX_CALL_TIMEOUT,
// GENBOX_RPM and GENBOX_TPM ("model=n,..."), GENBOX_RATE_WINDOW, GENBOX_INSTANCE_SHARE,
// GENBOX_RATE_HEADROOM, GENBOX_PRICES ("model=in/out,..." USD per 1M tokens),
// GENBOX_BREAKER_FAILURES, GENBOX_BREAKER_WINDOW, GENBOX_BREAKER_FAILURE_RATIO,
// GENBOX_BREAKER_MIN_VOLUME and GENBOX_BREAKER_COOLDOWN. A value that does not parse, or a
// policy that fails Validate, is an error naming its variable.
func Config(getenv func(string) string) (gemini.Config, error) {
	c := gemini.DefaultConfig()
	r := envconfig.New(getenv)
	r.String("GENBOX_GEMINI_BACKEND", &c.Backend)
	r.String("GEMINI_API_KEY", &c.APIKey)
	r.String("GOOGLE_GEMINI_BASE_URL", &c.BaseURL)
	r.String("GOOGLE_CLOUD_PROJECT", &c.Project)
	r.String("GOOGLE_CLOUD_LOCATION", &c.Location)
	readPricing(r, &c.Pricing)
	r.Int("GENBOX_MAX_ATTEMPTS", &c.MaxAttempts)
	r.Int("GENBOX_MODEL_ATTEMPTS", &c.ModelAttempts)
	r.Int("GENBOX_QUALITY_ATTEMPTS", &c.QualityAttempts)
	r.Int("GENBOX_BREAKER_FAILURES", &c.Breaker.ConsecutiveFailures)
	r.Int("GENBOX_BREAKER_MIN_VOLUME", &c.Breaker.MinVolume)
	r.Duration("GENBOX_BACKOFF_BASE", &c.BackoffBase)
	r.Duration("GENBOX_BACKOFF_MAX", &c.BackoffMax)
	r.Duration("GENBOX_MAX_RETRY_WAIT", &c.MaxRetryWait)
	r.Duration("GENBOX_CALL_TIMEOUT", &c.CallTimeout)
	r.Duration("GENBOX_FLEX_CALL_TIMEOUT", &c.FlexCallTimeout)
	r.Duration("GENBOX_RATE_WINDOW", &c.RateWindow)
	r.Duration("GENBOX_BREAKER_WINDOW", &c.Breaker.Window)
	r.Duration("GENBOX_BREAKER_COOLDOWN", &c.Breaker.Cooldown)
	r.Float("GENBOX_INSTANCE_SHARE", &c.InstanceShare)
	r.Float("GENBOX_RATE_HEADROOM", &c.RateHeadroom)
	r.Float("GENBOX_BREAKER_FAILURE_RATIO", &c.Breaker.FailureRatio)
	r.Func("GENBOX_RPM", func(s string) (err error) { c.RPM, err = parseRates(s); return err })
	r.Func("GENBOX_TPM", func(s string) (err error) { c.TPM, err = parseRates(s); return err })
	if err := r.Err(); err != nil {
		return gemini.Config{}, err
	}
	return c, c.Validate()
}

// Pricing reads the pricing alone, as Config reads it: GENBOX_MODEL_CHAIN ("a,b") and
// GENBOX_PRICES ("model=in/out,..." USD per 1M tokens).
func Pricing(getenv func(string) string) (gemini.Pricing, error) {
	p := gemini.DefaultPricing()
	r := envconfig.New(getenv)
	readPricing(r, &p)
	if err := r.Err(); err != nil {
		return gemini.Pricing{}, err
	}
	return p, p.Validate()
}

// readPricing points r at the pricing's variables.
func readPricing(r *envconfig.Reader, p *gemini.Pricing) {
	r.List("GENBOX_MODEL_CHAIN", &p.Models)
	r.Func("GENBOX_PRICES", func(s string) (err error) { p.Prices, err = gemini.ParsePrices(s); return err })
}

// parseRates parses "model=n,..." into positive per-minute rates.
func parseRates(s string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, item := range envconfig.Split(s) {
		model, val, ok := strings.Cut(item, "=")
		if !ok || strings.TrimSpace(model) == "" {
			return nil, fmt.Errorf("%q: want model=n", item)
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		if !(n > 0) || math.IsInf(n, 0) {
			return nil, fmt.Errorf("%q: want a finite positive rate", item)
		}
		out[strings.TrimSpace(model)] = n
	}
	return out, nil
}
