package worker

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

// tier is the service tier of t's call at now: priority for a priority task; flex for a flex
// task while its run_before, if it has one, is more than FlexMargin away (the Flex tier's latency
// target is minutes); standard otherwise.
func (h *Handler) tier(t *protocol.Task, now time.Time) gemini.Tier {
	switch {
	case t.Mode == task.ModePriority:
		return gemini.TierPriority
	case t.Mode == task.ModeFlex && (t.RunBefore == nil || now.Add(h.pol.FlexMargin).Before(*t.RunBefore)):
		return gemini.TierFlex
	}
	return gemini.TierStandard
}

// flexCanWait reports whether a shed flex task may wait out its next shed backoff and still be
// called on the Flex tier before run_before.
func (h *Handler) flexCanWait(t *protocol.Task, now time.Time) bool {
	worst := h.pol.retryBackoff().Ceiling(t.Sheds + 1)
	return t.RunBefore == nil || now.Add(worst+h.pol.FlexMargin).Before(*t.RunBefore)
}

// generate makes t's call on its tier. A flex call the Flex tier shed, when waiting for a retry
// could miss run_before, is made again at once on the standard tier; what both calls spent is
// summed.
func (h *Handler) generate(ctx context.Context, log *slog.Logger, t *protocol.Task, req gemini.Request) (gemini.Result, error) {
	req.Tier = h.tier(t, time.Now())
	res, err := h.gen.Generate(ctx, req)
	if req.Tier != gemini.TierFlex || gemini.ClassOf(err) != gemini.Shed || h.flexCanWait(t, time.Now()) {
		return res, err
	}
	log.InfoContext(ctx, "flex call shed and run_before is near; calling on the standard tier", "run_before", t.RunBefore)
	req.Tier = gemini.TierStandard
	more, err := h.gen.Generate(ctx, req)
	return sumResults(res, more), err
}

// sumResults is what two Generate calls of one attempt spent, with the second's answer.
func sumResults(a, b gemini.Result) gemini.Result {
	b.Usage = a.Usage.Add(b.Usage)
	b.InDoubt = a.InDoubt.Add(b.InDoubt)
	b.Calls += a.Calls
	b.CostUSD += a.CostUSD
	b.Attempts = append(slices.Clone(a.Attempts), b.Attempts...)
	return b
}

// shed hands back a task whose flex call was shed, with a jittered backoff that grows with its
// consecutive sheds: not a model failure, so no attempt is counted and no breaker moved.
func (r *run) shed(ctx context.Context) {
	delay := func(sheds int) time.Duration { return r.h.pol.retryBackoff().Delay(sheds, nil) }
	if t, ok := r.outcome(ctx, "shed", func(t *protocol.Task, now time.Time) {
		r.rules.Shed(t, r.epoch, now, delay)
	}); ok {
		r.h.metrics.Retry(ctx, string(gemini.Shed))
		r.log.InfoContext(ctx, "flex call shed; retry scheduled", "sheds", t.Sheds, "not_before", t.NotBefore)
	}
}
