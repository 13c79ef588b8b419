package worker

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// flashLike prices the tests' models as 2.5 Flash: N* = (0.30 + 1.00·1h) ÷ 0.27 ≈ 4.8 reuses.
const flashLike = "m=0.30/2.50;cached=0.03;storage=1,m2=0.30/2.50;cached=0.03;storage=1"

// sharedPrefix is a family's system instruction of about 9k tokens (the fake counts four bytes a
// token), the shape of seed 000.
var sharedPrefix = strings.Repeat("House style: cite every figure with its source and keep names as written. ", 490)

// prefixFamily renders every task with the shared prefix, cacheable, for models.
func prefixFamily(models ...string) fakeRenderer {
	return fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{SystemInstruction: sharedPrefix, Prompt: input, Models: models, ContextCache: true}, nil
	}}
}

type cacheBundle struct {
	*bundle
	caches  *ContextCaches
	pricing gemini.Pricing
}

func setupCaches(t *testing.T, ttl time.Duration) cacheBundle {
	t.Helper()
	b := setupWith(t, 0, map[string]string{"GENBOX_PRICES": flashLike, "GENBOX_MAX_ATTEMPTS": "4"})
	prices, err := gemini.ParsePrices(flashLike)
	if err != nil {
		t.Fatal(err)
	}
	pricing := gemini.Pricing{Prices: prices}
	return cacheBundle{bundle: b, pricing: pricing, caches: NewContextCaches(b.store, b.gen, pricing, ttl, 1, "w1", nil, nil)}
}

func (c cacheBundle) handler(owner string, r Renderer, caches *ContextCaches) *Handler {
	return New(c.store, c.gen, r, c.pub, c.log.With("owner", owner), policy(owner), WithModelPolicy(ModelPolicy{Estimator: c.gen, ContextCaches: caches}))
}

// run submits and handles tasks of tenant one after the other.
func (c cacheBundle) run(t *testing.T, h *Handler, tenant string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		c.task(t, id, func(d *protocol.Task) { d.Tenant = tenant })
		h.Handle(context.Background(), msg(id))
		if got := c.get(t, id); got.State != task.StateSucceeded {
			t.Fatalf("%s ended %s: %+v", id, got.State, got.Error)
		}
	}
}

func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return out
}

// A prefix reused past the break-even gets one cache; the calls after it are billed with the
// prefix at the cached rate, and every task's cost is its invoice.
func TestContextCacheCreatedPastTheBreakEven(t *testing.T) {
	t.Parallel()
	c := setupCaches(t, time.Hour)
	ids := seq("hot", 8)
	c.run(t, c.handler("w1", prefixFamily("m"), c.caches), "tenant-a", ids...)
	l := c.srv.Ledger()
	if len(l.Caches) != 1 || l.Caches[0].Model != "m" {
		t.Fatalf("caches %+v, want one for model m", l.Caches)
	}
	n := int(math.Ceil(c.pricing.Price("m").CacheBreakEven(1)))
	for i, id := range ids {
		bills := l.BillsFor(id)
		if len(bills) != 1 {
			t.Fatalf("%s billed %d times", id, len(bills))
		}
		cached := bills[0].Usage.CachedTokens
		if i < n-1 && cached != 0 || i >= n-1 && cached != l.Caches[0].Tokens {
			t.Errorf("%s (use %d, break-even %d): %d cached tokens", id, i+1, n, cached)
		}
		got := c.get(t, id)
		if want := bills[0].CostUSD(c.pricing); math.Abs(got.CostUSD-want) > 1e-15 || got.Usage != bills[0].Usage {
			t.Errorf("%s: cost %g usage %+v; the invoice %g %+v", id, got.CostUSD, got.Usage, want, bills[0].Usage)
		}
	}
	doc, err := c.store.GetContextCache(context.Background(), store.ContextCacheID("tenant-a", "m", sharedPrefix))
	if err != nil || doc.Name != l.Caches[0].Name || doc.Tenant != "tenant-a" {
		t.Errorf("context_caches document %+v, %v; want the cache of tenant-a", doc, err)
	}
}

func TestContextCacheBelowTheBreakEvenCreatesNone(t *testing.T) {
	t.Parallel()
	c := setupCaches(t, time.Hour)
	c.run(t, c.handler("w1", prefixFamily("m"), c.caches), "tenant-a", seq("cold", 4)...)
	if l := c.srv.Ledger(); len(l.Caches) != 0 {
		t.Errorf("caches %+v for 4 reuses under a break-even of %.1f", l.Caches, c.pricing.Price("m").CacheBreakEven(1))
	}
}

// A tenant never uses another tenant's cache of the same prefix.
func TestContextCacheIsNeverShared(t *testing.T) {
	t.Parallel()
	c := setupCaches(t, time.Hour)
	h := c.handler("w1", prefixFamily("m"), c.caches)
	c.run(t, h, "tenant-a", seq("a", 8)...)
	c.run(t, h, "tenant-b", "b-00")
	if bills := c.srv.Ledger().BillsFor("b-00"); bills[0].Usage.CachedTokens != 0 || bills[0].Request.CachedContent != "" {
		t.Errorf("tenant-b's first call used cache %q (%d cached tokens)", bills[0].Request.CachedContent, bills[0].Usage.CachedTokens)
	}
}

// Instances that all find the prefix worth caching at once create one cache between them.
func TestContextCacheCreationIsSingleFlight(t *testing.T) {
	t.Parallel()
	c := setupCaches(t, time.Hour)
	id := store.ContextCacheID("tenant-a", "m", sharedPrefix)
	var wg sync.WaitGroup
	names := make([]string, 6)
	for i := range names {
		cc := NewContextCaches(c.store, c.gen, c.pricing, time.Hour, 1, fmt.Sprintf("w%d", i), nil, nil)
		for range 5 {
			cc.use(context.Background(), c.log, id, "tenant-a", "m", cachedPrefix{system: "x"}) // too short to cache: counts the uses
		}
		wg.Go(func() {
			names[i] = cc.use(context.Background(), c.log, id, "tenant-a", "m", cachedPrefix{system: sharedPrefix})
		})
	}
	wg.Wait()
	l := c.srv.Ledger()
	if len(l.Caches) != 1 {
		t.Fatalf("%d caches created by six instances, want one", len(l.Caches))
	}
	for i, n := range names {
		if n != "" && n != l.Caches[0].Name {
			t.Errorf("instance %d uses %q, not the one cache %s", i, n, l.Caches[0].Name)
		}
	}
}

// A cache is bound to its model: a fallback to another model sends the whole prompt.
func TestContextCacheDroppedOnFallback(t *testing.T) {
	t.Parallel()
	c := setupCaches(t, time.Hour)
	h := c.handler("w1", prefixFamily("m", "m2"), c.caches)
	c.run(t, h, "tenant-a", seq("warm", 6)...)
	c.srv.FailNext("m", 503, 503)
	c.run(t, h, "tenant-a", "fell-back")
	got := c.get(t, "fell-back")
	bills := c.srv.Ledger().BillsFor("fell-back")
	if !got.Degraded || len(bills) != 1 || bills[0].Request.Model != "m2" || bills[0].Request.CachedContent != "" || bills[0].Usage.CachedTokens != 0 {
		t.Errorf("degraded %v, bills %+v: want one uncached call to m2", got.Degraded, bills)
	}
}

// A cache in use is extended; one found gone sends the call whole and is replaced.
func TestContextCacheExtendedAndReplaced(t *testing.T) {
	t.Parallel()
	// A TTL that the run after half of it outlives on a loaded machine: with 2 s, a run that
	// took 0.8 s found the cache expired and created another instead of extending it.
	c := setupCaches(t, 6*time.Second)
	h := c.handler("w1", prefixFamily("m"), c.caches)
	// With a 6 s TTL the break-even is (0.30 + 1.00·6/3600) ÷ 0.27 ≈ 1.1 reuses.
	c.run(t, h, "tenant-a", "ttl-0", "ttl-1")
	first := c.srv.Ledger().Caches
	if len(first) != 1 {
		t.Fatalf("caches %+v", first)
	}
	time.Sleep(3200 * time.Millisecond)
	c.run(t, h, "tenant-a", "ttl-2")
	if l := c.srv.Ledger(); !l.Caches[0].End.After(first[0].End) {
		t.Errorf("a cache used past half its TTL still expires at %s", l.Caches[0].End)
	}
	client, err := genai.NewClient(context.Background(), c.srv.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Caches.Delete(context.Background(), first[0].Name, nil); err != nil {
		t.Fatal(err)
	}
	c.run(t, h, "tenant-a", "gone-0", "gone-1")
	l := c.srv.Ledger()
	if b := l.BillsFor("gone-0"); len(b) != 1 || b[0].Usage.CachedTokens != 0 {
		t.Errorf("the call after the cache was deleted: %+v, want one billed call with the prefix whole", b)
	}
	if len(l.Caches) != 2 || l.BillsFor("gone-1")[0].Request.CachedContent != l.Caches[1].Name {
		t.Errorf("caches %+v: want the deleted one replaced and used", l.Caches)
	}
}

// slowCaches delays every cache creation, so that calls of one instance pile up behind it.
type slowCaches struct{ next http.RoundTripper }

func (s slowCaches) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cachedContents") {
		time.Sleep(300 * time.Millisecond)
	}
	return s.next.RoundTrip(r)
}

// The calls of one instance share its lease owner: while one of them creates the cache, the
// others go uncached instead of creating another (they would renew the same owner's lease).
func TestContextCacheCreationIsSingleFlightInAnInstance(t *testing.T) {
	t.Parallel()
	c := setupCaches(t, time.Hour)
	cfg, err := geminienv.Config(func(k string) string {
		return map[string]string{"GOOGLE_GEMINI_BASE_URL": c.srv.URL, "GENBOX_MODEL_CHAIN": "m", "GENBOX_PRICES": flashLike}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	slow, err := gemini.New(context.Background(), cfg, gemini.WithHTTPClient(&http.Client{Transport: slowCaches{http.DefaultTransport}}))
	if err != nil {
		t.Fatal(err)
	}
	cc := NewContextCaches(c.store, slow, c.pricing, time.Hour, 1, "w1", nil, nil)
	id := store.ContextCacheID("tenant-a", "m", sharedPrefix)
	for range 5 {
		cc.use(context.Background(), c.log, id, "tenant-a", "m", cachedPrefix{system: "x"})
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 30 * time.Millisecond) // arriving while the first creates it
			cc.use(context.Background(), c.log, id, "tenant-a", "m", cachedPrefix{system: sharedPrefix})
		})
	}
	wg.Wait()
	if n := len(c.srv.Ledger().Caches); n != 1 {
		t.Errorf("%d caches created by eight calls of one instance during a creation, want one", n)
	}
}
