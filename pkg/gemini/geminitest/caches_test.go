package geminitest_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// prefix is a system instruction of about n tokens (the fake counts four bytes a token).
func prefix(n int) string { return strings.Repeat("Rule: cite the source. ", n*4/23+1) }

func TestCachedContentPrefixesRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	sys := prefix(2000)
	cc, err := b.client.Caches.Create(ctx, model, &genai.CreateCachedContentConfig{
		SystemInstruction: genai.NewContentFromText(sys, genai.RoleUser), TTL: time.Hour, DisplayName: "family-x",
	})
	if err != nil {
		t.Fatalf("Caches.Create: %v", err)
	}
	if !strings.HasPrefix(cc.Name, "cachedContents/") || cc.Model != "models/"+model || cc.UsageMetadata == nil || cc.UsageMetadata.TotalTokenCount < 2000 {
		t.Fatalf("cache = %+v, want a cachedContents/… of models/%s with its token count", cc, model)
	}
	if d := time.Until(cc.ExpireTime); d < 59*time.Minute || d > time.Hour {
		t.Errorf("expires in %s, want the hour asked", d)
	}
	cached, err := b.generate(ctx, model, "question one", &genai.GenerateContentConfig{CachedContent: cc.Name})
	if err != nil {
		t.Fatalf("generate with the cache: %v", err)
	}
	whole, err := b.generate(ctx, model, "question one", &genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText(sys, genai.RoleUser)})
	if err != nil {
		t.Fatal(err)
	}
	cu, wu := cached.UsageMetadata, whole.UsageMetadata
	if cu.CachedContentTokenCount != cc.UsageMetadata.TotalTokenCount || cu.PromptTokenCount <= cu.CachedContentTokenCount {
		t.Errorf("cached usage = %+v, want cachedContentTokenCount %d within a larger prompt count", cu, cc.UsageMetadata.TotalTokenCount)
	}
	if wu.CachedContentTokenCount != 0 {
		t.Errorf("whole prompt reports %d cached tokens, want none", wu.CachedContentTokenCount)
	}
	if cached.Text() != whole.Text() {
		t.Errorf("answer with the cache %q, without %q: want the same", cached.Text(), whole.Text())
	}

	later, err := b.client.Caches.Update(ctx, cc.Name, &genai.UpdateCachedContentConfig{TTL: 3 * time.Hour})
	if err != nil {
		t.Fatalf("Caches.Update: %v", err)
	}
	if !later.ExpireTime.After(cc.ExpireTime.Add(time.Hour)) {
		t.Errorf("after a 3h TTL update it expires %s, before %s", later.ExpireTime, cc.ExpireTime)
	}
	if got, err := b.client.Caches.Get(ctx, cc.Name, nil); err != nil || got.ExpireTime != later.ExpireTime {
		t.Errorf("Caches.Get = %+v, %v", got, err)
	}
	if _, err := b.client.Caches.Delete(ctx, cc.Name, nil); err != nil {
		t.Fatalf("Caches.Delete: %v", err)
	}
	_, err = b.generate(ctx, model, "question two", &genai.GenerateContentConfig{CachedContent: cc.Name})
	if e := apiError(t, err); e.Code != http.StatusForbidden {
		t.Errorf("generate with a deleted cache: %v, want 403", err)
	}
	l := b.srv.Ledger()
	if len(l.Caches) != 1 || l.Caches[0].Tokens != int64(cc.UsageMetadata.TotalTokenCount) || l.Caches[0].Hours() <= 0 || l.Caches[0].Hours() > 1.0/60 {
		t.Errorf("ledger caches %+v, want one stored from creation to deletion", l.Caches)
	}
	if l.Bills[0].Usage.CachedTokens != int64(cu.CachedContentTokenCount) {
		t.Errorf("billed cached tokens %d, want %d", l.Bills[0].Usage.CachedTokens, cu.CachedContentTokenCount)
	}
}

func TestCachedContentRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.SetCacheMinTokens("gemini-2.5-pro", 4096)
	ctx := t.Context()
	_, err := b.client.Caches.Create(ctx, model, &genai.CreateCachedContentConfig{SystemInstruction: genai.NewContentFromText("too short", genai.RoleUser)})
	if e := apiError(t, err); e.Code != http.StatusBadRequest || !strings.Contains(e.Message, "min_total_token_count=1024") {
		t.Errorf("a small cache: %v, want 400 naming the minimum", err)
	}
	_, err = b.client.Caches.Create(ctx, "gemini-2.5-pro", &genai.CreateCachedContentConfig{SystemInstruction: genai.NewContentFromText(prefix(2000), genai.RoleUser)})
	if e := apiError(t, err); e.Code != http.StatusBadRequest || !strings.Contains(e.Message, "min_total_token_count=4096") {
		t.Errorf("a cache under the pro minimum: %v, want 400", err)
	}
	cc, err := b.client.Caches.Create(ctx, model, &genai.CreateCachedContentConfig{SystemInstruction: genai.NewContentFromText(prefix(2000), genai.RoleUser)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.generate(ctx, "gemini-2.5-flash-lite", "q", &genai.GenerateContentConfig{CachedContent: cc.Name})
	if e := apiError(t, err); e.Code != http.StatusBadRequest || !strings.Contains(e.Message, "has to be the same") {
		t.Errorf("a cache used with another model: %v, want 400", err)
	}
	_, err = b.generate(ctx, model, "q", &genai.GenerateContentConfig{CachedContent: cc.Name, SystemInstruction: genai.NewContentFromText("x", genai.RoleUser)})
	if e := apiError(t, err); e.Code != http.StatusBadRequest || !strings.Contains(e.Message, "system_instruction") {
		t.Errorf("a cache with a system instruction: %v, want 400", err)
	}
	short, err := b.client.Caches.Create(ctx, model, &genai.CreateCachedContentConfig{SystemInstruction: genai.NewContentFromText(prefix(2000), genai.RoleUser), TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := b.client.Caches.Get(ctx, short.Name, nil); apiError(t, err).Code != http.StatusForbidden {
		t.Errorf("an expired cache: %v, want 403", err)
	}
	for c, err := range b.client.Caches.All(ctx) {
		if err != nil || c.Name == short.Name {
			t.Errorf("listing: %+v, %v; want only live caches", c, err)
		}
	}
}

func TestImplicitCaching(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.SetImplicitCaching(model, geminitest.ImplicitCaching{MinTokens: 1024, HitRate: 1})
	cfg := &genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText(prefix(2000), genai.RoleUser)}
	first, err := b.generate(t.Context(), model, "one", cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.generate(t.Context(), model, "two", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if first.UsageMetadata.CachedContentTokenCount != 0 || second.UsageMetadata.CachedContentTokenCount < 2000 {
		t.Errorf("cached tokens %d then %d, want a miss then a hit on the repeated prefix",
			first.UsageMetadata.CachedContentTokenCount, second.UsageMetadata.CachedContentTokenCount)
	}
}
