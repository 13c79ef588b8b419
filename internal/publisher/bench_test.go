package publisher

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/fscount"
	"github.com/genbox-dev/genbox/pkg/task"
)

// benchWorkers is the number of concurrent submitters.
const benchWorkers = 8

// benchRounds is how many times BenchmarkSubmitOverhead alternates between the two paths.
const benchRounds = 10

// BenchmarkSubmitOverhead compares POST /v1/tasks end to end (HTTP, auth, validation, the
// Firestore create and the Pub/Sub publish) with that bare create and publish called directly,
// on the same emulators in one run: b.N submissions of each, in rounds that alternate which path
// goes first, so both see the same machine. It reports each path's throughput and latency, their
// ratios, and the Firestore operations per submission. Run with e.g. -benchtime=2000x.
func BenchmarkSubmitOverhead(b *testing.B) {
	counter := &fscount.Counter{}
	e := setup(b, counted(b, counter), func(cfg *Config, d *Deps) { _, d.Publisher = emulatorBus(b, cfg.ProjectID) })
	waitCurrent(b, e.srv)
	body := mustJSON(b, validRequest())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchWorkers}}
	handler := &series{name: "handler", counter: counter, op: func() error {
		req, _ := http.NewRequest("POST", e.url+"/v1/tasks", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body) // read to the end, so the connection is reused
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return errors.New(resp.Status)
		}
		return nil
	}}
	bare := &series{name: "bare", counter: counter, op: func() error { return createPublish(e, validRequest()) }}
	for _, s := range []*series{handler, bare} { // warm connections, publishers and the emulator
		s.run(b, 4*benchWorkers)
		*s = series{name: s.name, counter: s.counter, op: s.op}
	}
	b.ResetTimer()
	per := (b.N + benchRounds - 1) / benchRounds
	for i := range benchRounds {
		first, second := handler, bare
		if i%2 == 1 {
			first, second = bare, handler
		}
		first.run(b, per)
		second.run(b, per)
	}
	b.StopTimer()
	for _, s := range []*series{handler, bare} {
		s.report(b)
	}
	b.ReportMetric(handler.rate()/bare.rate(), "throughput-ratio")
	b.ReportMetric(float64(handler.pct(50))/float64(bare.pct(50)), "p50-ratio")
	b.ReportMetric(float64(handler.pct(99))/float64(bare.pct(99)), "p99-ratio")
}

// series is one path's measurements over the rounds.
type series struct {
	name    string
	counter *fscount.Counter
	op      func() error
	lat     []time.Duration
	elapsed time.Duration
	ops     fscount.Counts
}

// run calls op n times on benchWorkers goroutines.
func (s *series) run(b *testing.B, n int) {
	lat := make([]time.Duration, n)
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var failed error
	before := s.counter.Counts()
	start := time.Now()
	for range benchWorkers {
		wg.Go(func() {
			for i := range next {
				t0 := time.Now()
				if err := s.op(); err != nil {
					once.Do(func() { failed = err })
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	s.elapsed += time.Since(start)
	if failed != nil {
		b.Fatalf("%s: %v", s.name, failed)
	}
	c := s.counter.Counts().Sub(before)
	s.ops = fscount.Counts{Reads: s.ops.Reads + c.Reads, Writes: s.ops.Writes + c.Writes, Commits: s.ops.Commits + c.Commits}
	s.lat = append(s.lat, lat...)
}

func (s *series) rate() float64 { return float64(len(s.lat)) / s.elapsed.Seconds() }

// pct returns the p-th percentile latency.
func (s *series) pct(p int) time.Duration {
	l := slices.Sorted(slices.Values(s.lat))
	return l[min(len(l)*p/100, len(l)-1)]
}

func (s *series) report(b *testing.B) {
	n := float64(len(s.lat))
	b.ReportMetric(s.rate(), s.name+"-subs/s")
	b.ReportMetric(float64(s.pct(50).Microseconds())/1000, s.name+"-p50-ms")
	b.ReportMetric(float64(s.pct(99).Microseconds())/1000, s.name+"-p99-ms")
	b.ReportMetric(float64(s.ops.Reads)/n, s.name+"-reads/sub")
	b.ReportMetric(float64(s.ops.Writes)/n, s.name+"-writes/sub")
}

// createPublish writes the document the handler writes for req and publishes its nudge: the
// Firestore and Pub/Sub work of one submission without the HTTP API around it.
func createPublish(e *env, req task.Request) error {
	normalize(&req)
	hash, err := requestHash(&req)
	if err != nil {
		return err
	}
	variant, err := testFamilies.Variant(req.Family, req.Variant)
	if err != nil {
		return err
	}
	t := e.srv.newTask(randomID(), e.tenant, "", hash, &req, variant, time.Now().UTC())
	if err := e.st.CreateTask(context.Background(), t); err != nil {
		return err
	}
	_, err = e.srv.pub.Publish(context.Background(), bus.TopicTasks, nil, map[string]string{
		task.AttrTaskID: t.ID, task.AttrTenant: t.Tenant, task.AttrFamily: t.Family, task.AttrVariant: t.Variant})
	return err
}
