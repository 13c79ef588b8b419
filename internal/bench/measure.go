package bench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// Publisher publishes a message (bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error)
}

var _ Publisher = (*bus.Publisher)(nil)

// publishCounts counts publishes per topic, across every countingPublisher that shares it.
type publishCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func newPublishCounts() *publishCounts { return &publishCounts{n: map[string]int{}} }

func (c *publishCounts) add(topic string) {
	c.mu.Lock()
	c.n[topic]++
	c.mu.Unlock()
}

func (c *publishCounts) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// countingPublisher counts its publishes in counts.
type countingPublisher struct {
	next   Publisher
	counts *publishCounts
}

var _ Publisher = (*countingPublisher)(nil)

func (p *countingPublisher) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error) {
	p.counts.add(topic)
	return p.next.Publish(ctx, topic, data, attrs)
}

// markingPublisher marks on tl the first successful publish of each task to topic.
type markingPublisher struct {
	next  Publisher
	tl    *timeline
	topic string
	mark  int
}

var _ Publisher = (*markingPublisher)(nil)

func (p *markingPublisher) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error) {
	id, err := p.next.Publish(ctx, topic, data, attrs)
	if err == nil && topic == p.topic {
		p.tl.mark(attrs[task.AttrTaskID], p.mark, time.Now())
	}
	return id, err
}

// injector decides the failures of a run. A decision is a pure function of the seed, the kind of
// failure, the task and how many times that kind was already decided for that task, so two runs
// of the same workload (genbox and the naive baseline) meet exactly the same failures.
type injector struct {
	seed uint64
	mu   sync.Mutex
	seen map[string]int
	hits sync.Map // kind -> *atomic.Int64
}

func newInjector(seed uint64) *injector { return &injector{seed: seed, seen: map[string]int{}} }

// Failure kinds.
const (
	failModel   = "model_503"   // a model call answered 503 UNAVAILABLE
	failPublish = "result_lost" // the step after a generation (publishing its result) fails
	failAck     = "ack_lost"    // the worker's ack never reaches Pub/Sub: the message comes back
	failWebhook = "webhook_5xx" // the receiver answers 503
)

// fail reports whether the next occurrence of kind for key fails at rate.
func (in *injector) fail(kind, key string, rate float64) bool {
	if rate <= 0 {
		return false
	}
	in.mu.Lock()
	n := in.seen[kind+"\x00"+key]
	in.seen[kind+"\x00"+key] = n + 1
	in.mu.Unlock()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], in.seed)
	h := sha256.Sum256([]byte(string(b[:]) + kind + "\x00" + key + "\x00" + strconv.Itoa(n)))
	u := float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53)
	if u >= rate {
		return false
	}
	v, _ := in.hits.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	return true
}

// counts returns how many failures of each kind were injected.
func (in *injector) counts() map[string]int {
	out := map[string]int{}
	in.hits.Range(func(k, v any) bool {
		out[k.(string)] = int(v.(*atomic.Int64).Load())
		return true
	})
	return out
}

// lossyPublisher fails the publishes of topic at rate (decided per task).
type lossyPublisher struct {
	next  Publisher
	in    *injector
	topic string
	rate  float64
}

var _ Publisher = (*lossyPublisher)(nil)

// errInjected is a failure the bench injected.
var errInjected = fmt.Errorf("bench: injected failure")

func (p *lossyPublisher) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) (string, error) {
	if topic == p.topic && p.in.fail(failPublish, attrs[task.AttrTaskID], p.rate) {
		return "", fmt.Errorf("publish %s: %w", topic, errInjected)
	}
	return p.next.Publish(ctx, topic, data, attrs)
}

// lostAcks turns the handler's acks into nacks at rate (decided per task): the work was done
// but Pub/Sub never heard so, as when the process dies between its last step and the ack.
func lostAcks(h bus.Handler, in *injector, rate float64) bus.Handler {
	return bus.HandlerFunc(func(ctx context.Context, m *bus.Message) bus.Result {
		r := h.Handle(ctx, m)
		if r == bus.Ack && in.fail(failAck, m.Attributes[task.AttrTaskID], rate) {
			return bus.Nack
		}
		return r
	})
}

// lossyWebhooks answers at rate (decided per task) 503 to the deliveries before recv sees them.
func lossyWebhooks(recv http.Handler, in *injector, rate float64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		taskID, _, _ := strings.Cut(req.Header.Get(webhook.HeaderID), ".")
		if in.fail(failWebhook, taskID, rate) {
			http.Error(w, "injected", http.StatusServiceUnavailable)
			return
		}
		recv.ServeHTTP(w, req)
	})
}

// percentile returns the p-quantile (0..1) of sorted durations, nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func sortedCopy(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

// resetPeakRSS resets the kernel's peak resident set size of this process (VmHWM), so that each
// run reports its own peak. It fails quietly where /proc/self/clear_refs is not writable.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// PeakRSS reads the peak resident set size (VmHWM) of the process pid in bytes; 0 when unknown
// (not Linux, or no such process).
func PeakRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// progress draws a progress bar on w until stop is called.
type progress struct {
	w     io.Writer
	name  string
	total int
	done  atomic.Int64
	stopc chan struct{}
	ended chan struct{}
}

func startProgress(w io.Writer, name string, total int) *progress {
	p := &progress{w: w, name: name, total: total, stopc: make(chan struct{}), ended: make(chan struct{})}
	if w == nil {
		close(p.ended)
		return p
	}
	start := time.Now()
	go func() {
		defer close(p.ended)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			p.draw(time.Since(start))
			select {
			case <-p.stopc:
				p.draw(time.Since(start))
				fmt.Fprintln(p.w)
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *progress) add() { p.done.Add(1) }

func (p *progress) draw(elapsed time.Duration) {
	const width = 30
	n := int(p.done.Load())
	filled := 0
	if p.total > 0 {
		filled = n * width / p.total
	}
	fmt.Fprintf(p.w, "\r%-7s [%s%s] %d/%d %s", p.name, strings.Repeat("#", filled), strings.Repeat(".", width-filled), n, p.total, elapsed.Truncate(100*time.Millisecond))
}

func (p *progress) stop() {
	select {
	case <-p.stopc:
	default:
		close(p.stopc)
	}
	<-p.ended
}
