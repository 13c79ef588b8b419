package gemini_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// TestOutageCallsAreBounded: during an outage of every model, the calls made are the failures
// that open each breaker plus one probe per model per cooldown, however many tasks arrive.
func TestOutageCallsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	b.srv.Outage(primary, time.Hour)
	b.srv.Outage(fallback, time.Hour)
	unavailable := 0
	for i := 0; i < 50; i++ {
		if _, err := b.client.Generate(ctx, request("o")); errors.Is(err, gemini.ErrUnavailable) {
			unavailable++
		}
	}
	// Task 1: 4 + 4 failures (model attempts). Task 2: the fifth failure of each opens it, and
	// its retry of each is refused: it parks like every later task.
	if n := b.srv.Ledger().Total.Calls; n != 10 {
		t.Errorf("%d calls before every breaker opened, want 10", n)
	}
	if unavailable != 49 {
		t.Errorf("%d tasks told to park, want 49", unavailable)
	}
	for cooldown := 1; cooldown <= 3; cooldown++ {
		b.clock.advance(31 * time.Second)
		for i := 0; i < 10; i++ {
			_, _ = b.client.Generate(ctx, request("o"))
		}
		if n, want := b.srv.Ledger().Total.Calls, 10+2*cooldown; n != want {
			t.Errorf("after %d cooldowns: %d calls, want %d (one probe per model per cooldown)", cooldown, n, want)
		}
	}
	if a := b.alertKeys(); len(a) != 2 {
		t.Errorf("alerts %v, want one per model", a)
	}
	// Recovery: the next probe closes the primary and work flows again.
	b.srv.Restore(primary)
	b.clock.advance(31 * time.Second)
	for i := 0; i < 5; i++ {
		if _, err := b.client.Generate(ctx, request("r")); err != nil {
			t.Fatalf("after recovery: %v", err)
		}
	}
}

// TestOutageConcurrentCallsAreBounded: with tasks in flight at once, each model still takes at
// most its opening failures plus the calls already under way when it opened.
func TestOutageConcurrentCallsAreBounded(t *testing.T) {
	t.Parallel()
	// The fake clock advances with every backoff of every worker: keep the cooldown out of reach.
	b := setup(t, func(c *gemini.Config) { c.Breaker.Cooldown = time.Hour })
	b.srv.Outage(primary, time.Hour)
	b.srv.Outage(fallback, time.Hour)
	const workers = 8
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < 20; i++ {
				_, _ = b.client.Generate(context.Background(), request("c"))
			}
		})
	}
	wg.Wait()
	l := b.srv.Ledger()
	for _, m := range []string{primary, fallback} {
		if n := l.Model(m).Calls; n > 5+workers {
			t.Errorf("%s took %d calls for 160 tasks, want at most %d", m, n, 5+workers)
		}
	}
	if b.client.Available(nil) {
		t.Error("available during the outage")
	}
}
