package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// ContextCacheAPI creates and extends explicit context caches (gemini.Client).
type ContextCacheAPI interface {
	CreateCache(ctx context.Context, model, displayName, systemInstruction string, files []gemini.File, ttl time.Duration) (gemini.Cache, error)
	ExtendCache(ctx context.Context, name string, ttl time.Duration) (time.Time, error)
}

var _ ContextCacheAPI = (*gemini.Client)(nil)

// minCachedPrefix is the smallest prefix worth asking Gemini to cache: the lowest minimum of
// the 2.5 models (Flash's 1,024 tokens). A model with a larger minimum refuses it once, and the
// prefix is not offered again.
const minCachedPrefix = 1024

// cacheLeaseTTL bounds the creation of one cache: the creation lease of its document.
const cacheLeaseTTL = time.Minute

// ContextCaches puts the shared prefix of a context_cache family — its system instruction, and
// the task's files when they come before the prompt (cachedPrefix) — into an explicit Gemini
// cache per (tenant, model, prefix) when its expected reuse pays for the cache's
// creation and storage (gemini.Price.CachePays: the reuses seen in the last TTL, over this
// instance's share of the traffic, discounted by the implicit cache hits observed), extends the
// TTL of a cache in use and lets an idle one expire. Creation is a single flight across
// instances (the creation lease of context_caches/{id}); a tenant's prefix is never offered to
// another tenant. Safe for concurrent use.
type ContextCaches struct {
	store   *store.Store
	api     ContextCacheAPI
	pricing gemini.Pricing
	ttl     time.Duration
	share   float64
	owner   string
	metrics *obs.Metrics
	budgets *quota.Budgets

	mu       sync.Mutex
	prefixes map[string]*prefixUse
}

// prefixUse is what this instance knows of one (tenant, model, prefix).
type prefixUse struct {
	uses []time.Time // within the last TTL
	// sent and hit are the prefix tokens sent without an explicit cache, and how many of them
	// implicit caching served: the observed implicit hit rate.
	sent, hit int64
	cache     gemini.Cache // the live cache, when known
	refused   bool         // Gemini refused to cache the prefix
	extending bool
	// obtaining: a call of this instance is finding or creating the cache. The creation lease
	// keeps other instances out; this keeps out the calls of this one, which share its owner.
	obtaining bool
}

// NewContextCaches returns the context caches of an instance that takes share of the traffic,
// each cache created for ttl and extended while in use. Cache creation and storage are
// counted in metrics and the tenants' spend (budgets), both optional.
func NewContextCaches(s *store.Store, api ContextCacheAPI, pricing gemini.Pricing, ttl time.Duration, share float64, owner string, metrics *obs.Metrics, budgets *quota.Budgets) *ContextCaches {
	return &ContextCaches{store: s, api: api, pricing: pricing, ttl: ttl, share: share, owner: owner, metrics: metrics, budgets: budgets,
		prefixes: map[string]*prefixUse{}}
}

// contextCache points req at the explicit cache of its family's prefix when there is one, or
// when one is now worth creating, and returns what to call with the call's result (the implicit
// hit rate, a cache found gone).
func (h *Handler) contextCache(ctx context.Context, log *slog.Logger, t *protocol.Task, r *prompts.Rendered, req gemini.Request) (gemini.Request, func(gemini.Result)) {
	cc := h.mp.ContextCaches
	p := prefixOf(req)
	if cc == nil || !r.ContextCache || p.empty() || h.mp.Estimator == nil {
		return req, func(gemini.Result) {}
	}
	model := h.mp.Estimator.Chain(req)[0]
	id := store.ContextCacheID(t.Tenant, model, p.key())
	name := cc.use(ctx, log, id, t.Tenant, model, p)
	if name != "" {
		req.CachedContent, req.CacheModel, req.FilesCached = name, model, len(p.files) > 0
	}
	return req, func(res gemini.Result) {
		cc.observe(id, p, name != "", res)
		if res.CacheLost {
			cc.forget(ctx, log, id, name)
		}
	}
}

// forget clears the prefix's document when it still names a cache found gone, so that no
// instance offers it again.
func (cc *ContextCaches) forget(ctx context.Context, log *slog.Logger, id, name string) {
	doc, err := cc.store.GetContextCache(ctx, id)
	if err != nil || doc.Name != name {
		return
	}
	doc.Name, doc.CacheExpireAt = "", nil
	if err := cc.store.SaveContextCache(context.WithoutCancel(ctx), id, *doc); err != nil {
		log.WarnContext(ctx, "a gone context cache is still recorded", "cache", name, "error", err)
	}
}

// use records a use of the prefix and returns the name of its live cache, creating one when
// the expected reuse pays for it; "" sends the prefix whole.
func (cc *ContextCaches) use(ctx context.Context, log *slog.Logger, id, tenant, model string, prefix cachedPrefix) string {
	now := time.Now()
	price := cc.pricing.Price(model)
	cc.mu.Lock()
	p := cc.prefix(id, now)
	p.uses = append(p.uses, now)
	live := p.cache.Name != "" && p.cache.Expire.After(now.Add(cc.ttl/10))
	extend := live && !p.extending && p.cache.Expire.Sub(now) < cc.ttl/2
	if extend {
		p.extending = true
	}
	var rate float64
	if p.sent > 0 {
		rate = float64(p.hit) / float64(p.sent)
	}
	pays := !live && !p.refused && !p.obtaining && prefix.tokens() >= minCachedPrefix &&
		price.CachePays(float64(len(p.uses))/cc.share, rate, cc.ttl.Hours())
	if pays {
		p.obtaining = true
	}
	cache := p.cache
	cc.mu.Unlock()
	switch {
	case extend:
		cc.extend(ctx, log, id, tenant, cache)
		return cache.Name
	case live:
		return cache.Name
	case !pays:
		return ""
	}
	defer func() {
		cc.mu.Lock()
		cc.prefix(id, time.Now()).obtaining = false
		cc.mu.Unlock()
	}()
	return cc.obtain(ctx, log, id, tenant, model, prefix)
}

// prefix returns the state of id under the lock, forgetting uses older than a TTL (and, when
// the map grows large, prefixes idle that long).
func (cc *ContextCaches) prefix(id string, now time.Time) *prefixUse {
	cut := now.Add(-cc.ttl)
	if len(cc.prefixes) > 10000 {
		for k, p := range cc.prefixes {
			if len(p.uses) == 0 || p.uses[len(p.uses)-1].Before(cut) {
				delete(cc.prefixes, k)
			}
		}
	}
	p := cc.prefixes[id]
	if p == nil {
		p = &prefixUse{}
		cc.prefixes[id] = p
	}
	i := 0
	for i < len(p.uses) && p.uses[i].Before(cut) {
		i++
	}
	p.uses = p.uses[i:]
	return p
}

// obtain returns the prefix's cache: one another instance created, or one created now under
// the document's creation lease. While another instance holds the lease the call goes uncached.
func (cc *ContextCaches) obtain(ctx context.Context, log *slog.Logger, id, tenant, model string, prefix cachedPrefix) string {
	if c, ok := cc.recorded(ctx, id); ok {
		return c.Name
	}
	lease := &claim.Doc{FS: cc.store.FS, Ref: cc.store.ContextCacheRef(id), Owner: cc.owner, TTL: cacheLeaseTTL}
	l, err := lease.Acquire(ctx)
	if err != nil {
		if !errors.Is(err, claim.ErrHeld) {
			log.WarnContext(ctx, "context cache lease unavailable; prefix sent whole", "error", err)
		}
		return ""
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx), l.Epoch) }()
	if c, ok := cc.recorded(ctx, id); ok {
		return c.Name
	}
	c, err := cc.api.CreateCache(ctx, model, id, prefix.system, prefix.files, cc.ttl)
	if err != nil {
		var apiErr genai.APIError
		if errors.As(err, &apiErr) && apiErr.Code == 400 {
			cc.mu.Lock()
			cc.prefixes[id].refused = true
			cc.mu.Unlock()
		}
		log.WarnContext(ctx, "context cache not created; prefix sent whole", "model", model, "error", err)
		return ""
	}
	expire := c.Expire
	if err := cc.store.SaveContextCache(context.WithoutCancel(ctx), id, store.ContextCache{Tenant: tenant, Model: model,
		PrefixSHA: store.PrefixSHA(prefix.key()), Name: c.Name, CacheExpireAt: &expire, Tokens: c.Tokens}); err != nil {
		log.WarnContext(ctx, "context cache not recorded; other instances will not find it", "error", err)
	}
	price := cc.pricing.Price(model)
	cc.spend(ctx, tenant, model, c.Tokens, price.Bill(task.Usage{PromptTokens: c.Tokens}, gemini.TierStandard)+price.Storage(c.Tokens, time.Until(c.Expire).Hours()))
	cc.remember(id, c)
	log.InfoContext(ctx, "context cache created", "model", model, "cache", c.Name, "tokens", c.Tokens, "files", len(prefix.files), "expire", c.Expire)
	return c.Name
}

// recorded returns the live cache the prefix's document names, remembering it.
func (cc *ContextCaches) recorded(ctx context.Context, id string) (gemini.Cache, bool) {
	doc, err := cc.store.GetContextCache(ctx, id)
	if err != nil || doc.Name == "" || doc.CacheExpireAt == nil || !doc.CacheExpireAt.After(time.Now().Add(cc.ttl/10)) {
		return gemini.Cache{}, false
	}
	c := gemini.Cache{Name: doc.Name, Model: doc.Model, Tokens: doc.Tokens, Expire: *doc.CacheExpireAt}
	cc.remember(id, c)
	return c, true
}

func (cc *ContextCaches) remember(id string, c gemini.Cache) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.prefix(id, time.Now()).cache = c
}

// extend pushes a cache in use out to a TTL from now; its added storage is spent.
func (cc *ContextCaches) extend(ctx context.Context, log *slog.Logger, id, tenant string, c gemini.Cache) {
	expire, err := cc.api.ExtendCache(ctx, c.Name, cc.ttl)
	cc.mu.Lock()
	p := cc.prefix(id, time.Now())
	p.extending = false
	if err == nil && p.cache.Name == c.Name {
		p.cache.Expire = expire
	}
	cc.mu.Unlock()
	if err != nil {
		log.WarnContext(ctx, "context cache not extended; it expires as it was", "cache", c.Name, "error", err)
		return
	}
	cc.spend(ctx, tenant, c.Model, 0, cc.pricing.Price(c.Model).Storage(c.Tokens, expire.Sub(c.Expire).Hours()))
	if err := cc.store.SaveContextCache(context.WithoutCancel(ctx), id, store.ContextCache{Tenant: tenant, Model: c.Model,
		Name: c.Name, CacheExpireAt: &expire, Tokens: c.Tokens}); err != nil {
		log.WarnContext(ctx, "extended context cache not recorded", "error", err)
	}
}

// spend counts what a cache cost (its creation's input tokens, its storage) in the metrics and
// the tenant's spend.
func (cc *ContextCaches) spend(ctx context.Context, tenant, model string, tokens int64, usd float64) {
	cc.metrics.Generation(ctx, model, tenant, task.Usage{PromptTokens: tokens, TotalTokens: tokens}, usd, 0)
	if cc.budgets != nil {
		cc.budgets.Record(tenant, usd)
	}
}

// observe learns from a call: the implicit hit rate of a prefix sent whole, or a cache gone.
func (cc *ContextCaches) observe(id string, prefix cachedPrefix, explicit bool, res gemini.Result) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	p := cc.prefix(id, time.Now())
	if res.CacheLost {
		p.cache = gemini.Cache{}
	}
	if explicit && !res.CacheLost || res.Calls == 0 {
		return
	}
	n := prefix.tokens()
	p.sent += n
	p.hit += min(res.Usage.CachedTokens, n)
}
