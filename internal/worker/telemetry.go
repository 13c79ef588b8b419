package worker

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

// SpanGeminiAttempt names the span of one model call.
const SpanGeminiAttempt = "gemini generate"

// AttemptSpans is the gemini.AttemptHook that makes each model call a span of its task: model,
// attempt number, tokens (by modality too) and, on failure, the error class (gemini.Class, or
// "canceled"), with the GenAI semantic conventions' attributes of a call through provider
// (obs.GenAIProviderGemini or obs.GenAIProviderVertex); m records the conventions' client
// metrics of each call (nil records none).
func AttemptSpans(provider string, m *obs.Metrics) gemini.AttemptHook {
	return func(ctx context.Context, a gemini.Attempt) (context.Context, func(gemini.Attempt)) {
		ctx, span := obs.Start(ctx, SpanGeminiAttempt, append(obs.GenerationAttrs(a.Model, a.Number, a.Usage), obs.GenAIAttrs(provider, a.Model)...)...)
		return ctx, func(a gemini.Attempt) {
			span.SetAttributes(obs.GenerationAttrs(a.Model, a.Number, a.Usage)...)
			span.SetAttributes(obs.ModalityAttrs(a.Usage)...)
			m.GenAICall(ctx, provider, a.Model, a.Usage, a.Latency, string(a.Class))
			obs.End(span, a.Err, string(a.Class))
		}
	}
}

// GenAIProvider is the GenAI conventions' provider of a model backend.
func GenAIProvider(backend string) string {
	if backend == gemini.BackendVertex {
		return obs.GenAIProviderVertex
	}
	return obs.GenAIProviderGemini
}

// MeteredBreakers passes each breaker change to next (*store.Store), which may be nil, and
// records the state it stands for in m (genbox.breaker.state) unless another instance's change
// came first.
func MeteredBreakers(next gemini.BreakerStore, m *obs.Metrics) gemini.BreakerStore {
	return meteredBreakers{next: next, m: m}
}

type meteredBreakers struct {
	next gemini.BreakerStore
	m    *obs.Metrics
}

var _ gemini.BreakerStore = meteredBreakers{}

func (b meteredBreakers) SaveBreaker(ctx context.Context, ch gemini.BreakerChange) error {
	var err error
	if b.next != nil {
		err = b.next.SaveBreaker(ctx, ch)
	}
	if !errors.Is(err, gemini.ErrBreakerMoved) { // a change another instance beat is not this breaker's state
		b.m.Breaker(ctx, ch.Model, string(ch.To))
	}
	return err
}

// SpanClaim names the span of the claim.
const SpanClaim = "claim task"

// tracedClaim is claim inside a span of its own, tagged with what the claim decided.
func (h *Handler) tracedClaim(ctx context.Context, id, tenant string) (claimResult, error) {
	ctx, span := obs.Start(ctx, SpanClaim)
	c, err := h.claim(ctx, id, tenant)
	span.SetAttributes(attribute.String(spanClaimOutcome, c.outcome.String()))
	obs.End(span, err, "")
	return c, err
}

const spanClaimOutcome = "genbox.claim.outcome"

func (o claimOutcome) String() string {
	switch o {
	case claimed:
		return "claimed"
	case claimExpired:
		return "expired"
	case claimDead:
		return "dead"
	case claimWaiting:
		return "waiting"
	}
	return "not_claimed"
}

// generationModel is the model a generation's metrics are recorded under: the one that answered,
// else the one whose failure ended the generation.
func generationModel(res gemini.Result, err error) string {
	var ge *gemini.Error
	if res.Model == "" && errors.As(err, &ge) {
		return ge.Model
	}
	return res.Model
}
