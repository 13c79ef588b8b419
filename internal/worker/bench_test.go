package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/fscount"
	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// countingPublisher counts publishes per topic.
type countingPublisher struct {
	next Publisher
	mu   sync.Mutex
	n    map[string]int
}

func (p *countingPublisher) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error) {
	p.mu.Lock()
	p.n[topic]++
	p.mu.Unlock()
	return p.next.Publish(ctx, topic, data, attrs)
}

// txCeiling measures the emulator's transaction ceiling: conc goroutines running read-modify-write
// transactions (MutateTask) on distinct task documents for d. It returns transactions per second.
func txCeiling(b *testing.B, st *store.Store, conc int, d time.Duration) float64 {
	b.Helper()
	ctx := context.Background()
	for i := range conc {
		if err := st.CreateTask(ctx, &protocol.Task{ID: fmt.Sprintf("ceiling-%d", i), State: task.StateSucceeded}); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Int64
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range conc {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if _, err := st.MutateTask(ctx, fmt.Sprintf("ceiling-%d", i), func(t *protocol.Task, _ time.Time) error {
					t.Attempts++
					return nil
				}); err == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// BenchmarkWorker measures, for short generations without cache at concurrency 64 with 500 ms
// fake latency: Firestore reads, writes and Pub/Sub publishes per successful task (counted at the
// gRPC layer and around the publisher), the paid window (call start to output commit), and the
// throughput against min(Little's-law bound, the emulator's measured transaction ceiling ÷ the
// two transactions a task needs). Messages are handed to Handle by 64 goroutines, as the pull's
// flow control would; each b.N is one task. Run with e.g. -benchtime=640x.
func BenchmarkWorker(b *testing.B) {
	const conc, latency = 64, 500 * time.Millisecond
	ctx := context.Background()
	project := emulator.ProjectID(b)
	counter := &fscount.Counter{}
	fs, err := counter.EmulatorClient(ctx, os.Getenv(emulator.FirestoreHostEnv), project)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { fs.Close() })
	st := store.New(fs)
	st.MaxAttempts = 20
	ps := testenv.Bus(b, project, bus.DefaultTopology())
	bp := bus.NewPublisher(ps)
	defer bp.Close()
	pub := &countingPublisher{next: bp, n: map[string]int{}}
	srv := geminitest.NewServer(geminitest.WithLatency("", geminitest.Fixed(latency)))
	defer srv.Close()
	env := map[string]string{"GOOGLE_GEMINI_BASE_URL": srv.URL, "GENBOX_MODEL_CHAIN": "m"}
	gcfg, err := geminienv.Config(func(k string) string { return env[k] })
	if err != nil {
		b.Fatal(err)
	}
	gen, err := gemini.New(ctx, gcfg)
	if err != nil {
		b.Fatal(err)
	}
	ceiling := txCeiling(b, st, conc, 3*time.Second)

	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%06d", i)
		doc := &protocol.Task{ID: ids[i], Tenant: "t", Family: "summarize", Variant: "default", Input: "text " + ids[i],
			State: task.StateQueued, CallbackURL: "https://app.example/hook"}
		if err := st.CreateTask(ctx, doc); err != nil {
			b.Fatal(err)
		}
	}
	pol := policy("bench")
	pol.LeaseTTL, pol.RenewEvery = 30*time.Second, 10*time.Second
	// An exponential histogram keeps the paid windows' quantiles within 1% (they span less than
	// an octave).
	tel := obstest.Metrics(b, sdkmetric.NewView(sdkmetric.Instrument{Name: obs.MetricPaidWindow},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationBase2ExponentialHistogram{MaxSize: 160, MaxScale: 20}}))
	h := New(st, gen, chain("m"), pub, slog.New(slog.DiscardHandler), pol, WithMetrics(tel.Metrics))
	c0 := counter.Counts()
	work := make(chan string)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for id := range work {
				h.Handle(ctx, &bus.Message{ID: id, Attributes: map[string]string{task.AttrTaskID: id}})
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()

	stored := tel.Sum(b, obs.MetricWorkerOutcomes, obs.AttrOutcome+"="+obs.WorkerStored)
	if stored != float64(b.N) {
		b.Fatalf("%.0f of %d tasks stored", stored, b.N)
	}
	n := stored
	throughput := n / elapsed.Seconds()
	little := conc / latency.Seconds()
	bound := min(little, ceiling/2)
	ops := counter.Counts().Sub(c0)
	b.ReportMetric(float64(ops.Reads)/n, "reads/task")
	b.ReportMetric(float64(ops.Writes)/n, "writes/task")
	pub.mu.Lock()
	b.ReportMetric(float64(pub.n[bus.TopicResults])/n, "result-publishes/task")
	b.ReportMetric(float64(len(pub.n)), "topics")
	pub.mu.Unlock()
	b.ReportMetric(throughput, "tasks/s")
	b.ReportMetric(little, "little-bound/s")
	b.ReportMetric(ceiling, "emulator-tx/s")
	b.ReportMetric(throughput/bound, "efficiency")
	b.ReportMetric(1000*tel.Quantile(b, obs.MetricPaidWindow, 0.5), "paid-window-p50-ms")
	b.ReportMetric(1000*tel.Quantile(b, obs.MetricPaidWindow, 0.99), "paid-window-p99-ms")
}
