package geminitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultCacheMinTokens is the smallest cache the fake creates for a model without its own
// minimum (SetCacheMinTokens): the 2.5 Flash models' minimum for explicit caching.
const DefaultCacheMinTokens = 1024

// defaultCacheTTL is the TTL of a cache created without ttl or expireTime, as Gemini's.
const defaultCacheTTL = time.Hour

// cache is one cachedContents resource.
type cache struct {
	id, model, displayName string
	system                 string
	contents               []string
	// files are the fileData parts of its contents, their bytes read when it was created: the
	// cache holds them, not the Files API, so it outlives the files it was made from.
	files            []File
	fileTokens       map[string]int64
	tokens           int64
	created, updated time.Time
	expire           time.Time
	deleted          *time.Time
}

func (c *cache) name() string { return "cachedContents/" + c.id }

// live reports whether the cache can serve a request at now.
func (c *cache) live(now time.Time) bool { return c.deleted == nil && now.Before(c.expire) }

// bill is what c is billed for: its creation, and its storage until it expires or is deleted.
func (c *cache) bill() CacheBill {
	end := c.expire
	if c.deleted != nil && c.deleted.Before(end) {
		end = *c.deleted
	}
	return CacheBill{Name: c.name(), DisplayName: c.displayName, Model: c.model, Tokens: c.tokens, Files: c.files, Start: c.created, End: end}
}

// wireCachedContent is a cachedContents resource on the wire.
type wireCachedContent struct {
	Name          string             `json:"name"`
	Model         string             `json:"model"`
	DisplayName   string             `json:"displayName,omitempty"`
	CreateTime    string             `json:"createTime"`
	UpdateTime    string             `json:"updateTime"`
	ExpireTime    string             `json:"expireTime"`
	UsageMetadata wireCacheUsageMeta `json:"usageMetadata"`
}

type wireCacheUsageMeta struct {
	TotalTokenCount int64 `json:"totalTokenCount"`
}

func (c *cache) wire() wireCachedContent {
	return wireCachedContent{Name: c.name(), Model: "models/" + c.model, DisplayName: c.displayName,
		CreateTime: timestamp(c.created), UpdateTime: timestamp(c.updated), ExpireTime: timestamp(c.expire),
		UsageMetadata: wireCacheUsageMeta{TotalTokenCount: c.tokens}}
}

// wireCacheRequest is the body of cachedContents.create and .patch.
type wireCacheRequest struct {
	Model             string        `json:"model"`
	DisplayName       string        `json:"displayName"`
	Contents          []wireContent `json:"contents"`
	SystemInstruction *wireContent  `json:"systemInstruction"`
	TTL               string        `json:"ttl"`
	ExpireTime        string        `json:"expireTime"`
}

// SetCacheMinTokens sets the smallest cache a model accepts (DefaultCacheMinTokens otherwise);
// a smaller one is refused with 400 INVALID_ARGUMENT, as Gemini refuses it.
func (f *Fake) SetCacheMinTokens(model string, n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cacheMin[model] = n
}

func (f *Fake) routeCaches() {
	f.mux.HandleFunc("POST /{version}/cachedContents", f.authorized(f.createCache))
	f.mux.HandleFunc("GET /{version}/cachedContents", f.authorized(f.listCaches))
	f.mux.HandleFunc("GET /{version}/cachedContents/{id}", f.authorized(f.getCache))
	f.mux.HandleFunc("PATCH /{version}/cachedContents/{id}", f.authorized(f.patchCache))
	f.mux.HandleFunc("DELETE /{version}/cachedContents/{id}", f.authorized(f.deleteCache))
}

// authorized wraps a resource route with the API key check of every call.
func (f *Fake) authorized(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if fail, ok := f.authorize(r); !ok {
			f.writeError(w, fail)
			return
		}
		h(w, r)
	}
}

// readJSON decodes a resource route's body into v, answering 400 when it cannot.
func (f *Fake) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil && len(bytes.TrimSpace(body)) > 0 {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "Invalid JSON payload received. " + err.Error()})
		return false
	}
	return true
}

func (f *Fake) createCache(w http.ResponseWriter, r *http.Request) {
	var in wireCacheRequest
	if !f.readJSON(w, r, &in) {
		return
	}
	model, ok := strings.CutPrefix(in.Model, "models/")
	if !ok || model == "" {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "* CreateCachedContentRequest.cached_content.model: model is required, as models/{model}"})
		return
	}
	if f.models != nil && !f.models[model] {
		f.writeError(w, apiFailure{code: http.StatusNotFound, message: fmt.Sprintf("models/%s is not found for API version %s, or is not supported for createCachedContent.", model, r.PathValue("version"))})
		return
	}
	now := time.Now()
	c := &cache{model: model, displayName: in.DisplayName, created: now, updated: now}
	if in.SystemInstruction != nil {
		c.system = in.SystemInstruction.text()
	}
	var refs []wireFileData
	for _, ct := range in.Contents {
		if text := ct.text(); text != "" {
			c.contents = append(c.contents, text)
		}
		for _, p := range ct.Parts {
			if p.FileData != nil {
				refs = append(refs, *p.FileData)
			}
		}
	}
	expire, fail := expiry(in, now, now.Add(defaultCacheTTL))
	if fail != nil {
		f.writeError(w, *fail)
		return
	}
	c.expire = expire
	f.mu.Lock()
	if c.files, fail = f.readFiles(refs, now); fail != nil {
		f.mu.Unlock()
		f.writeError(w, *fail)
		return
	}
	c.fileTokens = fileTokensOf(c.files)
	c.tokens = tokens(c.system) + tokens(strings.Join(c.contents, "\n"))
	for _, n := range c.fileTokens {
		c.tokens += n
	}
	minTokens, ok := pick(f.cacheMin, model)
	if !ok {
		minTokens = DefaultCacheMinTokens
	}
	if c.tokens < minTokens {
		f.mu.Unlock()
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("Cached content is too small. total_token_count=%d, min_total_token_count=%d", c.tokens, minTokens)})
		return
	}
	f.ids++
	c.id = fmt.Sprintf("fake%06d", f.ids)
	f.caches = append(f.caches, c)
	out := c.wire()
	f.mu.Unlock()
	f.log.InfoContext(r.Context(), "fake gemini cache created", "name", c.name(), "model", model, "tokens", c.tokens, "expire", out.ExpireTime)
	writeJSON(w, http.StatusOK, out)
}

// expiry is the expire time a create or patch asks for: ttl from now, or expireTime, or def.
func expiry(in wireCacheRequest, now, def time.Time) (time.Time, *apiFailure) {
	switch {
	case in.TTL != "":
		d, err := parseDuration(in.TTL)
		if err != nil || d <= 0 {
			return time.Time{}, &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("* cached_content.ttl: invalid duration %q", in.TTL)}
		}
		return now.Add(d), nil
	case in.ExpireTime != "":
		t, err := time.Parse(time.RFC3339Nano, in.ExpireTime)
		if err != nil || !t.After(now) {
			return time.Time{}, &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("* cached_content.expire_time: %q is not a future RFC 3339 time", in.ExpireTime)}
		}
		return t, nil
	}
	return def, nil
}

// parseDuration reads a google.protobuf.Duration in its JSON form ("3600s", "1.5s").
func parseDuration(s string) (time.Duration, error) {
	secs, ok := strings.CutSuffix(s, "s")
	if !ok {
		return 0, fmt.Errorf("duration %q has no s suffix", s)
	}
	v, err := strconv.ParseFloat(secs, 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(v * float64(time.Second)), nil
}

// lookupCache returns the live cache of id under the lock, or the answer Gemini gives for one
// that does not exist, has expired or was deleted.
func (f *Fake) lookupCache(id string, now time.Time) (*cache, *apiFailure) {
	for _, c := range f.caches {
		if c.id == id && c.live(now) {
			return c, nil
		}
	}
	return nil, &apiFailure{code: http.StatusForbidden, message: "CachedContent not found (or permission denied)"}
}

func (f *Fake) getCache(w http.ResponseWriter, r *http.Request) {
	f.answer(w, func() (any, *apiFailure) {
		c, fail := f.lookupCache(r.PathValue("id"), time.Now())
		if fail != nil {
			return nil, fail
		}
		return c.wire(), nil
	})
}

func (f *Fake) patchCache(w http.ResponseWriter, r *http.Request) {
	var in wireCacheRequest
	if !f.readJSON(w, r, &in) {
		return
	}
	f.answer(w, func() (any, *apiFailure) {
		now := time.Now()
		c, fail := f.lookupCache(r.PathValue("id"), now)
		if fail != nil {
			return nil, fail
		}
		expire, fail := expiry(in, now, c.expire)
		if fail != nil {
			return nil, fail
		}
		c.expire, c.updated = expire, now
		return c.wire(), nil
	})
}

func (f *Fake) deleteCache(w http.ResponseWriter, r *http.Request) {
	f.answer(w, func() (any, *apiFailure) {
		now := time.Now()
		c, fail := f.lookupCache(r.PathValue("id"), now)
		if fail != nil {
			return nil, fail
		}
		c.deleted = &now
		return struct{}{}, nil
	})
}

// answer runs fn under the lock and answers with what it returns, or with its failure.
func (f *Fake) answer(w http.ResponseWriter, fn func() (any, *apiFailure)) {
	f.mu.Lock()
	out, fail := fn()
	f.mu.Unlock()
	if fail != nil {
		f.writeError(w, *fail)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *Fake) listCaches(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	f.mu.Lock()
	var live []wireCachedContent
	for _, c := range f.caches {
		if c.live(now) {
			live = append(live, c.wire())
		}
	}
	f.mu.Unlock()
	page, next, fail := paginate(live, r.URL.Query())
	if fail != nil {
		f.writeError(w, *fail)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		CachedContents []wireCachedContent `json:"cachedContents,omitempty"`
		NextPageToken  string              `json:"nextPageToken,omitempty"`
	}{page, next})
}

// prefix resolves a request's cachedContent under the lock: the cache's system instruction,
// contents and files become the request's prefix and its tokens the request's cached tokens. A cache that
// is gone, or was made for another model, fails the request as Gemini does.
func (f *Fake) prefix(r *Request, now time.Time) *apiFailure {
	if r.CachedContent == "" {
		return nil
	}
	id, ok := strings.CutPrefix(r.CachedContent, "cachedContents/")
	if !ok {
		return &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("* GenerateContentRequest.cached_content: %q is not a cachedContents/{id} name", r.CachedContent)}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, fail := f.lookupCache(id, now)
	if fail != nil {
		return fail
	}
	if c.model != r.Model {
		return &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("Model used by GenerateContent request (models/%s) and CachedContent (models/%s) has to be the same.", r.Model, c.model)}
	}
	r.SystemInstruction = c.system
	r.Prompt = strings.Join(append(append([]string(nil), c.contents...), r.Prompt), "\n")
	r.Files = append(append([]File(nil), c.files...), r.Files...)
	r.cachedFileTokens = c.fileTokens
	r.CachedTokens = c.tokens
	return nil
}

// paginate cuts a listing into pages of pageSize (default 10, at most 1000) from pageToken, an
// offset the fake hands out.
func paginate[T any](all []T, q map[string][]string) (page []T, next string, fail *apiFailure) {
	size, start := 10, 0
	if v := first(q["pageSize"]); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, "", &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("* page_size: %q is not a non-negative integer", v)}
		}
		if n > 0 {
			size = min(n, 1000)
		}
	}
	if v := first(q["pageToken"]); v != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(v, "offset-"))
		if err != nil || n < 0 || !strings.HasPrefix(v, "offset-") {
			return nil, "", &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("* page_token: %q is not a page token of this listing", v)}
		}
		start = min(n, len(all))
	}
	end := min(start+size, len(all))
	if end < len(all) {
		next = "offset-" + strconv.Itoa(end)
	}
	return all[start:end], next, nil
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// timestamp renders t as a google.protobuf.Timestamp in its JSON form.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
