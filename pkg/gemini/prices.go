package gemini

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Tier is the service tier that serves a call, and so decides its price.
type Tier string

// Service tiers.
const (
	// TierStandard is the default synchronous tier, at the full price.
	TierStandard Tier = "standard"
	// TierFlex answers synchronously at about the batch price with a latency of minutes, and may
	// shed a request under load (ServiceTier flex).
	TierFlex Tier = "flex"
	// TierBatch is the Batch API: asynchronous, up to 24 h, about half the price.
	TierBatch Tier = "batch"
	// TierPriority answers first under load at a premium (ServiceTier priority); Gemini may serve
	// a priority request on the standard tier, and says so (usageMetadata.trafficType).
	TierPriority Tier = "priority"
)

// DefaultPrices is the price table used for models GENBOX_PRICES does not name: Google's
// published list prices when it was written, USD per 1M tokens (re-check before relying on
// them).
var DefaultPrices = map[string]Price{
	"gemini-2.5-flash": {InputPerM: 0.30, OutputPerM: 2.50, FlexInputPerM: 0.15, FlexOutputPerM: 1.25,
		BatchInputPerM: 0.15, BatchOutputPerM: 1.25, CachedInputPerM: 0.03, StoragePerMHour: 1.00,
		AudioInputPerM: 1.00, FlexAudioInputPerM: 0.50, BatchAudioInputPerM: 0.50},
	"gemini-2.5-flash-lite": {InputPerM: 0.10, OutputPerM: 0.40, FlexInputPerM: 0.05, FlexOutputPerM: 0.20,
		BatchInputPerM: 0.05, BatchOutputPerM: 0.20, CachedInputPerM: 0.01, StoragePerMHour: 1.00,
		AudioInputPerM: 0.30, FlexAudioInputPerM: 0.15, BatchAudioInputPerM: 0.15},
	"gemini-2.5-pro": {InputPerM: 1.25, OutputPerM: 10.00, FlexInputPerM: 0.625, FlexOutputPerM: 5.00,
		BatchInputPerM: 0.625, BatchOutputPerM: 5.00, CachedInputPerM: 0.125, StoragePerMHour: 4.50},
}

// Price is what a model costs, in USD per million tokens: input and output on each tier, audio
// input on each tier, input tokens served from a context cache, and a cache's storage per hour.
type Price struct {
	InputPerM, OutputPerM           float64 // standard tier
	FlexInputPerM, FlexOutputPerM   float64
	BatchInputPerM, BatchOutputPerM float64
	// AudioInputPerM (and its flex and batch rates) prices the prompt tokens usageMetadata counts
	// as AUDIO; zero prices them as the tier's text input.
	AudioInputPerM, FlexAudioInputPerM, BatchAudioInputPerM float64
	// PriorityInputPerM and PriorityOutputPerM price the Priority tier; zero: priced as
	// standard × PriorityMarkup.
	PriorityInputPerM, PriorityOutputPerM float64
	// CachedInputPerM prices the prompt tokens a context cache served (cachedContentTokenCount),
	// explicit or implicit, on every tier.
	CachedInputPerM float64
	// StoragePerMHour prices an explicit cache's storage: per million cached tokens per hour.
	// Zero means unknown, and genbox creates no explicit cache for the model.
	StoragePerMHour float64
}

// Cost returns the standard-tier cost in USD of promptTokens and outputTokens, none of them
// cached: the worst case every estimate and max_cost_usd check uses.
func (p Price) Cost(promptTokens, outputTokens int64) float64 {
	return (float64(promptTokens)*p.InputPerM + float64(outputTokens)*p.OutputPerM) / 1e6
}

// PriorityMarkup prices the Priority tier of a model whose price names none: its standard price
// times this (Google's published premium when it was written: re-check before relying on it).
const PriorityMarkup = 1.8

// audioRate is the audio input price of tier, the tier's text input price when none is set.
func (p Price) audioRate(tier Tier) float64 {
	in, _ := p.rates(tier)
	r := p.AudioInputPerM
	switch tier {
	case TierFlex:
		r = p.FlexAudioInputPerM
	case TierBatch:
		r = p.BatchAudioInputPerM
	case TierPriority:
		r = p.AudioInputPerM * PriorityMarkup
	}
	if r == 0 {
		return in
	}
	return r
}

// rates returns the input and output prices of tier.
func (p Price) rates(tier Tier) (in, out float64) {
	switch tier {
	case TierFlex:
		return p.FlexInputPerM, p.FlexOutputPerM
	case TierBatch:
		return p.BatchInputPerM, p.BatchOutputPerM
	case TierPriority:
		if p.PriorityInputPerM > 0 || p.PriorityOutputPerM > 0 {
			return p.PriorityInputPerM, p.PriorityOutputPerM
		}
		return p.InputPerM * PriorityMarkup, p.OutputPerM * PriorityMarkup
	}
	return p.InputPerM, p.OutputPerM
}

// Bill returns the cost in USD of a call that used u and was served on tier: its cached prompt
// tokens at the cached rate, its audio prompt tokens at the tier's audio rate, the rest of the
// prompt and the output at the tier's.
func (p Price) Bill(u task.Usage, tier Tier) float64 {
	in, out := p.rates(tier)
	cached := min(max(u.CachedTokens, 0), u.PromptTokens)
	audio := min(max(u.AudioTokens, 0), u.PromptTokens-cached)
	return (float64(u.PromptTokens-cached-audio)*in + float64(audio)*p.audioRate(tier) + float64(cached)*p.CachedInputPerM +
		float64(u.OutputTokens)*out) / 1e6
}

// Storage returns the cost in USD of keeping tokens in an explicit cache for hours.
func (p Price) Storage(tokens int64, hours float64) float64 {
	return float64(tokens) * hours * p.StoragePerMHour / 1e6
}

// Price returns model's price: the configured one, else the default table's, else zero.
func (p Pricing) Price(model string) Price { return p.price(model) }

// price returns model's price: the configured one, else the default table's, else zero.
func (p Pricing) price(model string) Price {
	if pr, ok := p.Prices[model]; ok {
		return pr
	}
	return DefaultPrices[model]
}

// servedTier is the tier usageMetadata.trafficType says served a call. A call that does not say
// is priced as standard: spend is never under-counted.
func servedTier(m *genai.GenerateContentResponseUsageMetadata) Tier {
	switch {
	case m == nil:
	case m.TrafficType == genai.TrafficTypeOnDemandFlex:
		return TierFlex
	case m.TrafficType == genai.TrafficTypeOnDemandPriority:
		return TierPriority
	}
	return TierStandard
}

// ParsePrices parses GENBOX_PRICES: a comma-separated list of
// "model=in/out[;flex=in/out][;batch=in/out][;priority=in/out][;cached=c][;storage=s][;audio=a]",
// USD per million tokens (storage per million tokens per hour). A part left out is derived: flex
// and batch at half the standard price, priority at PriorityMarkup times it, cached input at a
// tenth of the standard input (Google's published discounts for the 2.5 models), storage as the
// built-in table has it for the model, else zero — no explicit cache for that model; audio input
// (standard tier) at the standard input price, on flex and batch at half the standard audio
// price, on priority at PriorityMarkup times it.
func ParsePrices(s string) (map[string]Price, error) {
	out := map[string]Price{}
	for _, item := range splitList(s) {
		model, val, ok := strings.Cut(item, "=")
		model = strings.TrimSpace(model)
		if !ok || model == "" {
			return nil, fmt.Errorf("%q: want model=in/out", item)
		}
		parts := strings.Split(val, ";")
		in, outp, err := pair(parts[0])
		if err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		p := Price{InputPerM: in, OutputPerM: outp, FlexInputPerM: in / 2, FlexOutputPerM: outp / 2,
			BatchInputPerM: in / 2, BatchOutputPerM: outp / 2, CachedInputPerM: in / 10, StoragePerMHour: DefaultPrices[model].StoragePerMHour}
		for _, part := range parts[1:] {
			key, v, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok {
				return nil, fmt.Errorf("%q: %q: want key=value", item, part)
			}
			var err error
			switch key {
			case "flex":
				p.FlexInputPerM, p.FlexOutputPerM, err = pair(v)
			case "batch":
				p.BatchInputPerM, p.BatchOutputPerM, err = pair(v)
			case "priority":
				p.PriorityInputPerM, p.PriorityOutputPerM, err = pair(v)
			case "cached":
				p.CachedInputPerM, err = priceOf(v)
			case "storage":
				p.StoragePerMHour, err = priceOf(v)
			case "audio":
				p.AudioInputPerM, err = priceOf(v)
			default:
				err = fmt.Errorf("unknown price %q: want flex, batch, priority, cached, storage or audio", key)
			}
			if err != nil {
				return nil, fmt.Errorf("%q: %w", item, err)
			}
		}
		if p.AudioInputPerM == 0 {
			p.AudioInputPerM = in
		}
		p.FlexAudioInputPerM, p.BatchAudioInputPerM = p.AudioInputPerM/2, p.AudioInputPerM/2
		out[model] = p
	}
	return out, nil
}

// pair parses "in/out".
func pair(s string) (in, out float64, err error) {
	a, b, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, errors.New("want in/out")
	}
	in, err1 := priceOf(a)
	out, err2 := priceOf(b)
	return in, out, errors.Join(err1, err2)
}

// priceOf parses one finite, non-negative price.
func priceOf(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, err
	}
	if !(v >= 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s: want a finite price >= 0", s)
	}
	return v, nil
}
