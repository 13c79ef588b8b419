package autoscale

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/internal/bus"
)

// Waker starts a pool at zero: whoever nudges gemini-tasks calls Wake after writing the task,
// since a pool at zero runs no controller and no sweeper.
type Waker struct {
	cfg  Config
	fs   *firestore.Client
	doc  *firestore.DocumentRef
	pool Pool

	mu         sync.Mutex
	awakeUntil time.Time // the pool was seen awake: Wake need not look again before this
}

// NewWaker returns the waker of cfg's pool.
func NewWaker(cfg Config, fs *firestore.Client, pool Pool) *Waker {
	return &Waker{cfg: cfg, fs: fs, doc: stateDoc(fs, cfg), pool: pool}
}

// Wake makes sure the pool runs an instance, for a task written before the call. A pool seen
// awake is trusted for one Interval; the controller's drain to zero waits at least that long
// before its last count of the backlog, so a task written while a stale view was trusted is
// counted. A pool draining to zero is told to resume; a pool at zero gets one instance, its
// document first (wake_at, which the controller's sleep looks for), then the Admin API — which
// only ever raises the count: a pool the document has not seen yet (Terraform made it at
// worker_min_instances) is left as it is.
func (w *Waker) Wake(ctx context.Context) error {
	now := time.Now()
	w.mu.Lock()
	fresh := now.Before(w.awakeUntil)
	w.mu.Unlock()
	if fresh {
		return nil
	}
	start := false
	err := updateState(ctx, w.fs, w.doc, func(s *State) error {
		start = false
		if !s.asleep() {
			return errUnchanged
		}
		at := now.UTC()
		s.WakeAt, s.Draining, s.Settling = &at, false, false
		start = s.Instances == 0
		return nil
	})
	switch {
	case errors.Is(err, errUnchanged):
	case err != nil:
		return err
	case start:
		n, err := w.pool.Raise(ctx, 1)
		if err != nil {
			return err
		}
		if err := updateState(ctx, w.fs, w.doc, func(s *State) error { s.Instances = max(s.Instances, n); return nil }); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.awakeUntil = now.Add(w.cfg.Interval)
	w.mu.Unlock()
	return nil
}

// WakingPublisher returns pub, waking cfg's pool (WakeOnPublish) when it is autoscaled, and the
// function that closes what it opened for that.
func WakingPublisher(ctx context.Context, cfg Config, fs *firestore.Client, pub Publisher, log *slog.Logger) (Publisher, func() error, error) {
	if !cfg.Enabled() {
		return pub, func() error { return nil }, nil
	}
	pool, err := OpenCloudRun(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return WakeOnPublish(pub, NewWaker(cfg, fs, pool), log), pool.Close, nil
}

// Publisher publishes a message (bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

// WakeOnPublish returns p, which first wakes the pool through w whenever it publishes to
// gemini-tasks: every nudge of a task follows the task's write. A failed wake is logged; the
// nudge is published all the same.
func WakeOnPublish(p Publisher, w *Waker, log *slog.Logger) Publisher {
	return &waking{Publisher: p, w: w, log: log}
}

type waking struct {
	Publisher
	w   *Waker
	log *slog.Logger
}

func (p *waking) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error) {
	if topic == bus.TopicTasks {
		if err := p.w.Wake(ctx); err != nil {
			p.log.WarnContext(ctx, "worker pool not woken", "error", err)
		}
	}
	return p.Publisher.Publish(ctx, topic, data, attrs)
}
