package publisher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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

// benchRounds is how many times BenchmarkSubmitOverhead cycles through its paths: many short
// rounds, so that the emulators' pauses fall on every path alike rather than on whichever ran then.
const benchRounds = 50

// BenchmarkSubmitOverhead compares POST /v1/tasks end to end (HTTP, auth, validation, the
// Firestore create and the Pub/Sub publish) with that bare create and publish called directly,
// on the same emulators in one run: b.N submissions of each, in rounds that alternate which path
// goes first, so all see the same machine. A third path, http, is that bare create and publish
// behind a minimal HTTP handler on the same loopback client: the cost of an HTTP round trip alone,
// so the handler's own overhead (auth, validation, idempotency, problem responses) can be told
// apart from it. It reports each path's throughput and latency, the handler's ratios to bare and
// to http, and the Firestore operations per submission. Run with e.g. -benchtime=2000x.
func BenchmarkSubmitOverhead(b *testing.B) {
	counter := &fscount.Counter{}
	e := setup(b, counted(b, counter), func(cfg *Config, d *Deps) { _, d.Publisher = emulatorBus(b, cfg.ProjectID) })
	waitCurrent(b, e.srv)
	body := mustJSON(b, validRequest())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchWorkers}}
	post := func(url string) error {
		req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
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
	}
	minimal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req task.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := createPublish(e, req); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	b.Cleanup(minimal.Close)
	handler := &series{name: "handler", counter: counter, op: func() error { return post(e.url + "/v1/tasks") }}
	bare := &series{name: "bare", counter: counter, op: func() error { return createPublish(e, validRequest()) }}
	overHTTP := &series{name: "http", counter: counter, op: func() error { return post(minimal.URL) }}
	all := []*series{handler, bare, overHTTP}
	for _, s := range all { // warm connections, publishers and the emulator
		s.run(b, 4*benchWorkers)
		*s = series{name: s.name, counter: s.counter, op: s.op}
	}
	b.ResetTimer()
	per := (b.N + benchRounds - 1) / benchRounds
	for i := range benchRounds {
		for j := range all { // each round starts with the next path
			all[(i+j)%len(all)].run(b, per)
		}
	}
	b.StopTimer()
	for _, s := range all {
		s.report(b)
	}
	b.ReportMetric(handler.rate()/bare.rate(), "throughput-ratio")
	b.ReportMetric(float64(handler.pct(50))/float64(bare.pct(50)), "p50-ratio")
	b.ReportMetric(float64(handler.pct(99))/float64(bare.pct(99)), "p99-ratio")
	b.ReportMetric(handler.rate()/overHTTP.rate(), "throughput-ratio-to-http")
	b.ReportMetric(float64(handler.pct(50))/float64(overHTTP.pct(50)), "p50-ratio-to-http")
	b.ReportMetric(float64(handler.pct(99))/float64(overHTTP.pct(99)), "p99-ratio-to-http")
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
	b.Helper()
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
	b.Helper()
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
	hash, err := requestHash(&req, nil)
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
	_, err = e.srv.pub.Publish(context.Background(), bus.TopicTasks, nil, nudgeAttrs(t))
	return err
}
