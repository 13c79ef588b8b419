package worker

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// cheapStorage prices model m as 2.5 Flash with a storage price that makes an hour's cache pay
// from its second use: N* = (0.30 + 0.01·1h) ÷ 0.27 ≈ 1.15 reuses.
const cheapStorage = "m=0.30/2.50;cached=0.03;storage=0.01"

// fileFamily renders every task with its files before the prompt, context_cache on.
func fileFamily() fakeRenderer {
	return fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{Prompt: input, Models: []string{"m"}, ContextCache: true}, nil
	}}
}

type fileCacheBundle struct {
	*fileBundle
	pricing gemini.Pricing
}

func setupFileCaches(t *testing.T) fileCacheBundle {
	t.Helper()
	b := setupFilesWith(t, map[string]string{"GENBOX_PRICES": cheapStorage})
	prices, err := gemini.ParsePrices(cheapStorage)
	if err != nil {
		t.Fatal(err)
	}
	return fileCacheBundle{fileBundle: b, pricing: gemini.Pricing{Prices: prices}}
}

// handler is a worker with its own context caches, as a new process has.
func (b fileCacheBundle) handler(owner string) *Handler {
	caches := NewContextCaches(b.store, b.gen, b.pricing, time.Hour, 1, owner, nil, nil)
	return New(b.store, b.gen, fileFamily(), b.pub, b.log.With("owner", owner), policy(owner),
		WithFiles(Files{Copier: b.gen, Objects: b.objs, Margin: time.Minute}),
		WithModelPolicy(ModelPolicy{Estimator: b.gen, ContextCaches: caches}))
}

// run submits and handles a task of tenant-a reading f, one after the other.
func (b fileCacheBundle) run(t *testing.T, h *Handler, f protocol.File, ids ...string) {
	t.Helper()
	for _, id := range ids {
		b.task(t, id, func(d *protocol.Task) { d.Tenant, d.Input, d.Files = "tenant-a", "question "+id, []protocol.File{f} })
		h.Handle(context.Background(), msg(id))
		if got := b.get(t, id); got.State != task.StateSucceeded {
			t.Fatalf("%s ended %s: %+v", id, got.State, got.Error)
		}
	}
}

// Tasks of a tenant naming the same large file share one context cache holding it: the fake
// counts one cachedContents create holding the file's bytes, every call after it names the
// cache and sends no file, reads the same bytes from it and is billed for them at the cached
// rate; the task's cost is its invoice. A process that starts afresh (a crash, a new instance)
// finds the recorded cache instead of making another. A new generation of the object is new
// bytes: a new cache.
func TestFileContextCacheSharedAcrossTasks(t *testing.T) {
	t.Parallel()
	b := setupFileCaches(t)
	pdf := bytes.Repeat([]byte("%PDF-1.7 master services agreement, clause after clause. "), 1200) // 69 kB
	f := b.put(t, "uploads/tenant-a/msa", "application/pdf", pdf)
	ids := seq("msa", 6)
	b.run(t, b.handler("w1"), f, ids[:4]...)
	b.run(t, b.handler("w2"), f, ids[4:]...) // a fresh process: no memory of the cache

	l := b.srv.Ledger()
	if len(l.Caches) != 1 {
		t.Fatalf("%d caches created for one file, want 1: %+v", len(l.Caches), l.Caches)
	}
	cache := l.Caches[0]
	if len(cache.Files) != 1 || cache.Files[0].SHA256 != sha(pdf) || cache.Files[0].Size != int64(len(pdf)) {
		t.Fatalf("the cache holds %+v, want the %d bytes of the document", cache.Files, len(pdf))
	}
	fileTokens := int64(len(pdf)) / 32 // the fake's count of a document
	var cachedCost, wholeCost float64
	for i, id := range ids {
		bills := l.BillsFor(id)
		if len(bills) != 1 {
			t.Fatalf("%s billed %d times", id, len(bills))
		}
		bill := bills[0]
		if len(bill.Request.Files) != 1 || bill.Request.Files[0].SHA256 != sha(pdf) {
			t.Errorf("%s: the model read %+v, want the document", id, bill.Request.Files)
		}
		// The first use of each process goes whole; its second pays for a cache: w1 creates
		// it, w2 finds it recorded.
		wantCache, wantCached := cache.Name, cache.Tokens
		if i == 0 || i == 4 {
			wantCache, wantCached = "", 0
		}
		if bill.Request.CachedContent != wantCache || bill.Usage.CachedTokens != wantCached || bill.Usage.DocumentTokens != fileTokens {
			t.Errorf("%s: cache %q, %d cached and %d document tokens; want cache %q, %d cached, %d document (the file sent once)",
				id, bill.Request.CachedContent, bill.Usage.CachedTokens, bill.Usage.DocumentTokens, wantCache, wantCached, fileTokens)
		}
		got := b.get(t, id)
		if want := bill.CostUSD(b.pricing); math.Abs(got.CostUSD-want) > 1e-15 || got.Usage != bill.Usage {
			t.Errorf("%s: cost %g usage %+v; the invoice %g %+v", id, got.CostUSD, got.Usage, want, bill.Usage)
		}
		if i == 0 {
			wholeCost = got.CostUSD
		} else {
			cachedCost = got.CostUSD
		}
	}
	t.Logf("a call with the %d-token file whole: $%.7f; through the cache: $%.7f; cache created once: $%.7f",
		fileTokens, wholeCost, cachedCost, cache.CostUSD(b.pricing))
	if cachedCost >= wholeCost/2 {
		t.Errorf("a call through the cache cost $%g, a whole one $%g: want the file at the cached rate", cachedCost, wholeCost)
	}

	// A new generation of the object is new bytes: a new cache, never the old one.
	next := bytes.Repeat([]byte("%PDF-1.7 amended agreement, clause after clause. "), 1400)
	f2 := b.put(t, "uploads/tenant-a/msa", "application/pdf", next)
	b.run(t, b.handler("w1"), f2, "amended-0", "amended-1")
	l = b.srv.Ledger()
	if len(l.Caches) != 2 || len(l.Caches[1].Files) != 1 || l.Caches[1].Files[0].SHA256 != sha(next) {
		t.Fatalf("caches after a new generation %+v, want a second one holding it", l.Caches)
	}
	if bill := l.BillsFor("amended-1")[0]; bill.Request.CachedContent != l.Caches[1].Name || bill.Request.Files[0].SHA256 != sha(next) {
		t.Errorf("amended-1 called with cache %q reading %+v, want %s and the new bytes", bill.Request.CachedContent, bill.Request.Files, l.Caches[1].Name)
	}
}

// Files after the prompt cannot be a cached prefix: such a family caches nothing of them.
func TestFilesAfterThePromptAreNotCached(t *testing.T) {
	t.Parallel()
	b := setupFileCaches(t)
	f := b.put(t, "doc", "application/pdf", bytes.Repeat([]byte("%PDF-1.7 body "), 5000))
	after := fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{Prompt: input, Models: []string{"m"}, ContextCache: true, FilePlacement: prompts.FilesAfter}, nil
	}}
	h := New(b.store, b.gen, after, b.pub, b.log, policy("w1"),
		WithFiles(Files{Copier: b.gen, Objects: b.objs, Margin: time.Minute}),
		WithModelPolicy(ModelPolicy{Estimator: b.gen, ContextCaches: NewContextCaches(b.store, b.gen, b.pricing, time.Hour, 1, "w1", nil, nil)}))
	b.run(t, h, f, seq("after", 3)...)
	if l := b.srv.Ledger(); len(l.Caches) != 0 {
		t.Errorf("caches %+v for files placed after the prompt, want none", l.Caches)
	}
}
