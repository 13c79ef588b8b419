package sweeper

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// countingPublisher counts the distinct tasks nudged on gemini-tasks, and says when it has seen
// want of them.
type countingPublisher struct {
	mu   sync.Mutex
	seen map[string]bool
	want int
	all  chan struct{}
}

func (p *countingPublisher) Publish(_ context.Context, _ string, _ []byte, attrs map[string]string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id := attrs[task.AttrTaskID]; !p.seen[id] {
		p.seen[id] = true
		if len(p.seen) == p.want {
			close(p.all)
		}
	}
	return "", nil
}

// benchEnv reads an integer knob of BenchmarkRedrive.
func benchEnv(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return n
}

// BenchmarkRedrive measures the sweep's re-drive rate on the emulator: GENBOX_BENCH_REDRIVE_N due
// tasks (default 2000) — the backlog Pub/Sub lost — re-driven by one sweeper instance leading 1
// and then 4 shards, with GENBOX_SWEEP_LIMIT's and GENBOX_SWEEP_PACE's defaults per shard
// (GENBOX_BENCH_REDRIVE_PACE overrides the pace) and a 1 s interval. Each iteration writes the
// backlog, then times the sweep from its start until every task has been nudged once; tasks/s is
// the backlog over that time (ns/op includes writing the backlog). Run it once per size:
//
//	GENBOX_BENCH_REDRIVE_N=20000 go test -run '^$' -bench BenchmarkRedrive -benchtime=1x ./internal/sweeper
func BenchmarkRedrive(b *testing.B) {
	n := benchEnv(b, "GENBOX_BENCH_REDRIVE_N", 2000)
	pace := benchEnv(b, "GENBOX_BENCH_REDRIVE_PACE", 200)
	for _, shards := range []int{1, 4} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			var rate float64
			for range b.N {
				rate = redrive(b, shards, n, pace)
			}
			b.ReportMetric(rate, "tasks/s")
		})
	}
}

// redrive writes n due tasks over shards and returns the rate at which one sweeper re-drives them.
func redrive(b *testing.B, shards, n, pace int) float64 {
	b.Helper()
	s := store.New(testenv.Firestore(b, emulator.ProjectID(b)))
	s.Shards = shards
	ctx := context.Background()
	ids := make(chan int)
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range ids {
				if err := s.CreateTask(ctx, &protocol.Task{ID: fmt.Sprintf("t%06d", i), Tenant: "a", Family: "f", Input: "x", State: task.StateQueued}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range n {
		ids <- i
	}
	close(ids)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	cfg := Config{Interval: time.Second, Limit: 500, Pace: float64(pace), ReleaseRate: 20,
		LeaderTTL: 3 * time.Second, BackoffBase: 30 * time.Second, BackoffMax: 15 * time.Minute, Shards: shards}
	pub := &countingPublisher{seen: map[string]bool{}, want: n, all: make(chan struct{})}
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, "bench")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- sw.Run(runCtx) }()
	select {
	case <-pub.all:
	case <-time.After(10 * time.Minute):
		b.Fatalf("%d of %d tasks re-driven in 10 minutes", len(pub.seen), n)
	}
	took := time.Since(start)
	stop()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.Logf("shards=%d: %d tasks re-driven in %s", shards, n, took.Round(time.Millisecond))
	return float64(n) / took.Seconds()
}
