package chaos_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bench"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// The worker alone, as its own OS process, with 256 model calls in flight (issue #20: peak RSS
// at most 100 MiB). `genbox bench` can only report its whole process — every service, the
// emulators' clients, the fake and the bench — which does not tell the worker's share.
//
// Each iteration submits a backlog while no worker runs, then starts a fresh worker on it, so the
// worker takes the whole of its flow control at once: 640 messages in hand (the default
// 2·slots + reserve), 256 calls and its 128 claimed-ahead tasks; and its VmHWM is that drain's
// alone. Run it once:
//
//	go test -run '^$' -bench BenchmarkWorkerMemory -benchtime=1x ./test/chaos/
func BenchmarkWorkerMemory(b *testing.B) {
	const (
		slots = 256 // GENBOX_CONCURRENCY
		tasks = 1000
		// Long enough that the first call is still running when the last of the first 256 claims
		// has committed, on the Firestore emulator of a loaded 2-core machine.
		latency = 3 * time.Second
	)
	s := newStack(b, geminitest.Fixed(latency), "")
	// The services' own durations, as deployed: the chaos ones renew each lease twice a second —
	// 768 writes a second for 384 claimed tasks — which no deployment does.
	s.withServiceTimings()
	// The tenant's default limits would hold it to 10 calls on the instance and 50 submissions a
	// second. Its budget stays the worker's default, $10 a day (the project's $100): each call
	// reserves 8 attempts of a summarize call's worst case (1024 output tokens at Flash's list
	// price), $0.021, so 256 at once reserve $5.3 and spend far less; no task waits on a budget.
	if _, err := s.store.SetTenantLimits(b.Context(), "chaos", store.Limits{Concurrency: slots}); err != nil {
		b.Fatal(err)
	}
	w := s.procs[svcWorker]
	// Every other capacity setting is the default that follows from the slots; no GENBOX_RPM or
	// GENBOX_TPM, so no rate limiter holds a call back.
	w.env["GENBOX_CONCURRENCY"] = strconv.Itoa(slots)
	// A restarted worker would be another process, with a VmHWM of its own: it must not restart.
	w.supervised = false
	s.start(svcPublisher, svcResultHandler, svcDLQNotifier)

	var peakBytes int64
	var peakCalls, succeeded int
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		s.submit(tasks, "mem"+strconv.Itoa(i))
		s.logf("%d tasks submitted; starting the worker", tasks)
		b.StartTimer()
		w.start(b)
		stop := peakOf(s.fake.InFlight)
		succeeded = s.checkInvariants(3*time.Minute, 0).Tasks // every task so far, or it fails the run
		peakCalls = max(peakCalls, stop())
		rss, err := w.peakRSS()
		if err != nil {
			b.Fatal(err)
		}
		peakBytes = max(peakBytes, rss)
		w.stop()
	}
	b.StopTimer()
	if peakCalls < slots {
		b.Errorf("at most %d calls at once reached the fake Gemini, want %d: the worker's memory was not measured with every slot calling", peakCalls, slots)
	}
	b.ReportMetric(float64(peakBytes)/(1<<20), "worker-peak-RSS-MiB")
	b.ReportMetric(float64(succeeded)/float64(b.N), "tasks-succeeded")
	b.ReportMetric(float64(peakCalls), "peak-calls")
}

// peakRSS is the current process's peak resident set size in bytes, read while it still runs:
// /proc forgets a process once it has exited.
func (p *proc) peakRSS() (int64, error) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if closedChan(exited) {
		return 0, fmt.Errorf("%s exited before its peak RSS was read", p.name)
	}
	rss := bench.PeakRSS(cmd.Process.Pid)
	if rss == 0 {
		return 0, fmt.Errorf("%s (pid %d): no VmHWM in /proc", p.name, cmd.Process.Pid)
	}
	return rss, nil
}

// peakOf polls n every millisecond until stop is called; stop returns the highest value seen.
func peakOf(n func() int) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	peak := 0
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			peak = max(peak, n())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() int {
		close(done)
		wg.Wait()
		return peak
	}
}
