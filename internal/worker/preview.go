package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

// defaultPreviewEvery throttles previews when the policy leaves PreviewEvery unset.
const defaultPreviewEvery = 500 * time.Millisecond

// previewTimeout bounds one preview write: a slow one is skipped, never waited for.
const previewTimeout = 2 * time.Second

// previews makes a streamed task's call stream (req.OnPartial) and writes the text so far to
// previews/{id} at most once per PreviewEvery, from a goroutine of its own, so that neither the
// stream nor the paid window waits for Firestore. A preview is never the output: the output is
// what persist commits on the task, under the outbox's rules. stop ends the writer and waits for
// it; call it as soon as the call returns. A task without stream gets req back unchanged.
func (h *Handler) previews(ctx context.Context, log *slog.Logger, t *protocol.Task, epoch int64, req gemini.Request) (gemini.Request, func()) {
	if !t.Stream {
		return req, func() {}
	}
	every := h.pol.PreviewEvery
	if every <= 0 {
		every = defaultPreviewEvery
	}
	var mu sync.Mutex
	latest, written := "", ""
	wake := make(chan struct{}, 1)
	req.OnPartial = func(text string) {
		mu.Lock()
		latest = text
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	wctx, end := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		warned := false
		for {
			select {
			case <-wctx.Done():
				return
			case <-wake:
			}
			mu.Lock()
			text := latest
			mu.Unlock()
			if text == written {
				continue
			}
			pctx, cancel := context.WithTimeout(wctx, previewTimeout)
			err := h.store.SavePreview(pctx, t.ID, store.Preview{Replay: t.Replay, Epoch: epoch, Text: text})
			cancel()
			if err != nil && wctx.Err() == nil && !warned {
				warned = true
				log.WarnContext(ctx, "preview not written; the next one may be", "error", err)
			}
			written = text
			select {
			case <-wctx.Done():
				return
			case <-time.After(every):
			}
		}
	}()
	return req, func() { end(); <-done }
}
