package gemini_test

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// A context cache holding a file serves calls that send only their prompt: the model reads the
// file's bytes from the cache, its tokens are billed at the cached rate, the answer is the one
// the whole request gets, and the cache outlives the Files API copy it was made from.
func TestCacheHoldsAFile(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) {
		prices, err := gemini.ParsePrices(primary + "=1/2;cached=0.25;storage=1")
		if err != nil {
			t.Fatal(err)
		}
		c.Prices = prices
	})
	ctx := context.Background()
	pdf := bytes.Repeat([]byte("%PDF-1.7 a long contract, clause after clause. "), 1000)
	c, err := b.client.CopyFile(ctx, "gb-contract", "application/pdf", int64(len(pdf)), bytes.NewReader(pdf))
	if err != nil {
		t.Fatal(err)
	}
	file := gemini.File{URI: c.URI, MIMEType: "application/pdf", Size: int64(len(pdf)), Key: "contract#1"}
	cache, err := b.client.CreateCache(ctx, primary, "contract", "", []gemini.File{file}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fileTokens := int64(len(pdf)) / 32 // the fake's count for a document
	if cache.Tokens != fileTokens {
		t.Fatalf("cache of %d tokens, want the file's %d", cache.Tokens, fileTokens)
	}
	if err := b.client.DeleteFile(ctx, c.Name); err != nil {
		t.Fatal(err)
	}

	req := request("cached")
	req.Models = []string{primary}
	req.Files = []gemini.File{file}
	req.CachedContent, req.CacheModel, req.FilesCached = cache.Name, primary, true
	res, err := b.client.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	l := b.srv.Ledger()
	if len(l.Caches) != 1 || len(l.Caches[0].Files) != 1 || l.Caches[0].Files[0].SHA256 != digest(pdf) {
		t.Fatalf("caches %+v: want one holding the document", l.Caches)
	}
	bill := l.Bills[0]
	if diff := cmp.Diff([]string{digest(pdf)}, []string{bill.Request.Files[0].SHA256}); diff != "" || len(bill.Request.Files) != 1 {
		t.Errorf("files the model read (-want +got):\n%s", diff)
	}
	u := res.Usage
	if u.CachedTokens != fileTokens || u.DocumentTokens != fileTokens {
		t.Errorf("usage %+v: want %d cached document tokens", u, fileTokens)
	}
	want := (float64(u.PromptTokens-u.CachedTokens)*1 + float64(u.CachedTokens)*0.25 + float64(u.OutputTokens)*2) / 1e6
	if math.Abs(res.CostUSD-want) > 1e-12 {
		t.Errorf("cost %g, want %g (the file at the cached 0.25/M)", res.CostUSD, want)
	}
}
