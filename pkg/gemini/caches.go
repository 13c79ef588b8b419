package gemini

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"google.golang.org/genai"
)

// Cache is an explicit context cache (cachedContents/{id}) of one model: a prefix whose tokens
// later calls are billed at the cached rate while it lives.
type Cache struct {
	Name   string
	Model  string
	Tokens int64
	Expire time.Time
}

// CreateCache caches systemInstruction and files (as one user turn, in order) for model for ttl
// under displayName; either may be empty. A request naming the cache sends neither
// (Request.FilesCached). Gemini refuses a prefix under the model's minimum size with a 400.
func (c *Client) CreateCache(ctx context.Context, model, displayName, systemInstruction string, files []File, ttl time.Duration) (Cache, error) {
	cfg := &genai.CreateCachedContentConfig{DisplayName: displayName, TTL: ttl}
	if systemInstruction != "" {
		cfg.SystemInstruction = genai.NewContentFromText(systemInstruction, genai.RoleUser)
	}
	if len(files) > 0 {
		parts := make([]*genai.Part, len(files))
		for i, f := range files {
			parts[i] = genai.NewPartFromURI(f.URI, f.MIMEType)
		}
		cfg.Contents = []*genai.Content{genai.NewContentFromParts(parts, genai.RoleUser)}
	}
	cc, err := c.caches.Create(ctx, model, cfg)
	if err != nil {
		return Cache{}, fmt.Errorf("create context cache for %s: %w", model, err)
	}
	return cacheOf(cc), nil
}

// ExtendCache sets a cache to expire ttl from now, and returns its new expiry.
func (c *Client) ExtendCache(ctx context.Context, name string, ttl time.Duration) (time.Time, error) {
	cc, err := c.caches.Update(ctx, name, &genai.UpdateCachedContentConfig{TTL: ttl})
	if err != nil {
		return time.Time{}, fmt.Errorf("extend context cache %s: %w", name, err)
	}
	return cc.ExpireTime, nil
}

var inf = math.Inf(1)

func cacheOf(cc *genai.CachedContent) Cache {
	out := Cache{Name: cc.Name, Model: strings.TrimPrefix(cc.Model, "models/"), Expire: cc.ExpireTime}
	if cc.UsageMetadata != nil {
		out.Tokens = int64(cc.UsageMetadata.TotalTokenCount)
	}
	return out
}

// CacheBreakEven is N*, the reuses within hours of a prefix at which an explicit cache pays for
// itself: creating it costs the prefix once at the input price p and storing it s per hour, and
// each reuse saves p − c over sending it whole, so N* = (p + s·H) ÷ (p − c). It is +Inf for a
// model whose cached input saves nothing or whose storage price is unknown (zero).
func (p Price) CacheBreakEven(hours float64) float64 {
	save := p.InputPerM - p.CachedInputPerM
	if save <= 0 || p.StoragePerMHour <= 0 {
		return inf
	}
	return (p.InputPerM + p.StoragePerMHour*hours) / save
}

// CachePays reports whether n reuses within hours pay for an explicit cache when implicit
// caching already serves a fraction implicitRate of them at the cached rate: only the reuses
// implicit caching misses save anything, so it pays when n·(1 − h)·(p − c) > p + s·H.
func (p Price) CachePays(n, implicitRate, hours float64) bool {
	be := p.CacheBreakEven(hours)
	return be != inf && n*(1-min(max(implicitRate, 0), 1)) > be
}
