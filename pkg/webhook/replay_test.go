package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/webhook"
)

// signed returns the headers of a delivery of body with id, signed with secret at ts.
func signed(t testing.TB, secret, id string, ts time.Time, body []byte) http.Header {
	t.Helper()
	s, err := webhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	s.SetHeaders(h, id, ts, body)
	return h
}

func TestGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	secret := newSecret(t)
	v, _ := webhook.NewVerifier(secret)
	body := []byte(`{"type":"task.succeeded"}`)
	now := time.Now()

	t.Run("a replay within the tolerance is refused, after Forget accepted", func(t *testing.T) {
		t.Parallel()
		g := webhook.NewGuard(v, nil)
		h := signed(t, secret, "t1.task.succeeded.0", now, body)
		if err := g.Check(ctx, body, h); err != nil {
			t.Fatalf("first delivery: %v", err)
		}
		if err := g.Check(ctx, body, h); !errors.Is(err, webhook.ErrReplayed) {
			t.Fatalf("the same request again: %v, want ErrReplayed", err)
		}
		retry := signed(t, secret, "t1.task.succeeded.0", now.Add(time.Minute), body)
		if err := g.Check(ctx, body, retry); !errors.Is(err, webhook.ErrReplayed) {
			t.Fatalf("genbox's retry (same id, new timestamp): %v, want ErrReplayed", err)
		}
		if err := g.Forget(ctx, "t1.task.succeeded.0"); err != nil {
			t.Fatal(err)
		}
		if err := g.Check(ctx, body, retry); err != nil {
			t.Fatalf("after Forget (the receiver failed to act): %v, want accepted", err)
		}
	})
	t.Run("forged requests are not recorded", func(t *testing.T) {
		t.Parallel()
		seen := webhook.NewMemorySeen(10)
		g := webhook.NewGuard(v, seen)
		forged := signed(t, newSecret(t), "t2.task.succeeded.0", now, body)
		for range 20 {
			if err := g.Check(ctx, body, forged); !errors.Is(err, webhook.ErrNoMatchingSignature) {
				t.Fatalf("forged: %v", err)
			}
		}
		if seen.Len() != 0 {
			t.Fatalf("%d forged ids recorded", seen.Len())
		}
		if err := g.Check(ctx, body, signed(t, secret, "t2.task.succeeded.0", now, body)); err != nil {
			t.Fatalf("the genuine delivery after forgeries: %v", err)
		}
	})
	t.Run("ids are remembered for twice the tolerance by default", func(t *testing.T) {
		t.Parallel()
		at := now
		seen := webhook.NewMemorySeen(10)
		seen.Now = func() time.Time { return at }
		g := webhook.NewGuard(v, seen)
		h := signed(t, secret, "t3.task.succeeded.0", now, body)
		if err := g.Check(ctx, body, h); err != nil {
			t.Fatal(err)
		}
		at = now.Add(2*webhook.DefaultTolerance + time.Second)
		if err := g.Check(ctx, body, signed(t, secret, "t3.task.succeeded.0", now, body)); err != nil {
			t.Fatalf("past the memory: %v, want accepted (this verifier's clock still admits the timestamp)", err)
		}
		g.Remember = time.Hour
		long := signed(t, secret, "t3b.task.succeeded.0", now, body)
		if err := g.Check(ctx, body, long); err != nil {
			t.Fatal(err)
		}
		at = at.Add(59 * time.Minute)
		if err := g.Check(ctx, body, long); !errors.Is(err, webhook.ErrReplayed) {
			t.Fatalf("within Remember: %v, want ErrReplayed", err)
		}
	})
	t.Run("the store is bounded", func(t *testing.T) {
		t.Parallel()
		seen := webhook.NewMemorySeen(3)
		g := webhook.NewGuard(v, seen)
		for i := range 10 {
			if err := g.Check(ctx, body, signed(t, secret, fmt.Sprintf("t4-%d", i), now, body)); err != nil {
				t.Fatal(err)
			}
		}
		if seen.Len() != 3 {
			t.Fatalf("%d ids remembered, want the bound 3", seen.Len())
		}
	})
	t.Run("concurrent copies: exactly one accepted", func(t *testing.T) {
		t.Parallel()
		g := webhook.NewGuard(v, nil)
		h := signed(t, secret, "t5.task.succeeded.0", now, body)
		var accepted atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				if g.Check(ctx, body, h) == nil {
					accepted.Add(1)
				}
			})
		}
		wg.Wait()
		if n := accepted.Load(); n != 1 {
			t.Fatalf("%d copies accepted, want 1", n)
		}
	})
}
