// Package geminitest is a fake Gemini API server that speaks the real REST protocol
// (generateContent, streamGenerateContent?alt=sse, countTokens, usageMetadata and Google error
// JSON; the flex service tier with its shedding and trafficType; batches of inlined requests
// through models/{model}:batchGenerateContent and batches/{id} get, list, cancel and delete;
// cachedContents create, get, list, patch and delete, with the minimum-token rule and
// cachedContentTokenCount; implicit caching; continuation tokens), so that the real
// google.golang.org/genai client runs unchanged against it. Its answers are deterministic
// functions of the request; tests script outputs (Responder), latency, failure schedules,
// outages, RPM/TPM limits, held calls, flex shedding and batch turnarounds and outcomes, and read
// a Ledger of calls, billed tokens by tier, cache storage and batch jobs that bills every
// generation that finished, even when its client had gone — as an invoice would.
//
// In tests:
//
//	srv := geminitest.NewServer()
//	defer srv.Close()
//	client, _ := genai.NewClient(ctx, srv.ClientConfig())
//
// Standalone (genbox fakegemini): Serve(ctx, addr, log), then point GOOGLE_GEMINI_BASE_URL at it.
package geminitest

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Fake is the fake Gemini API as an http.Handler. Its controls are safe for concurrent use and
// take effect for the calls that arrive after them. A control set for model "" applies to every
// model that has none of its own.
type Fake struct {
	log        *slog.Logger
	apiKey     string
	models     map[string]bool
	retryDelay time.Duration
	mux        *http.ServeMux
	done       chan struct{}
	closeOnce  sync.Once

	mu        sync.Mutex
	responder Responder
	latency   map[string]Latency
	limits    map[string]Limits
	windows   map[string][]admitted
	failures  map[string][]int
	outages   map[string]time.Time
	gates     map[string]*Gate
	rng       *rand.Rand
	calls     int
	inflight  int
	ledger    ledger

	shedding map[string]Shedding        // flex shedding per model
	fallback map[string]float64         // the fraction of priority requests served on the standard tier, per model
	implicit map[string]ImplicitCaching // implicit caching per model
	seen     map[string]time.Time       // implicit caching: when each model+system prefix was last seen
	caches   []*cache                   // every cachedContents resource, in creation order
	cacheMin map[string]int64           // the minimum tokens of a cache, per model
	batches  []*batchJob                // every batch job, in creation order
	plans    map[string]BatchPlan       // how each model's batch jobs run
	// batchScript holds each model's scripted batch outcomes (FailBatchesNext).
	batchScript map[string][]string
	// deleteFailures holds the codes of the next failed batch deletes (FailBatchDeletesNext).
	deleteFailures []int
	// batchLimit is the largest batch create body accepted (SetBatchByteLimit).
	batchLimit int
	// batchesRefused counts the batch creates refused for their size.
	batchesRefused int
	ids            int // resource ids handed out (caches, batches, files, uploads)

	files   []*storedFile             // every Files API file, in upload order
	uploads map[string]*pendingUpload // resumable uploads begun, by upload id
	fileTTL time.Duration
	// failDeletes is how many of the next files.delete calls fail (FailFileDeletes).
	failDeletes int
}

var _ http.Handler = (*Fake)(nil)

// Option configures a Fake at construction.
type Option func(*Fake)

// WithLogger logs every call (model, method, code, tokens); the default (and nil) discards.
func WithLogger(log *slog.Logger) Option {
	return func(f *Fake) {
		if log != nil {
			f.log = log
		}
	}
}

// WithAPIKey makes the fake accept only this key (400 API_KEY_INVALID otherwise). Without it any
// non-empty key is accepted; a call without a key always gets 403 PERMISSION_DENIED.
func WithAPIKey(key string) Option { return func(f *Fake) { f.apiKey = key } }

// WithModels restricts the models the fake knows; others get 404 NOT_FOUND. By default every
// model name is served.
func WithModels(models ...string) Option {
	return func(f *Fake) {
		f.models = make(map[string]bool, len(models))
		for _, m := range models {
			f.models[m] = true
		}
	}
}

// WithResponder sets the Responder (see SetResponder).
func WithResponder(r Responder) Option { return func(f *Fake) { f.responder = r } }

// WithLatency sets a model's latency (see SetLatency).
func WithLatency(model string, l Latency) Option { return func(f *Fake) { f.latency[model] = l } }

// WithLimits sets a model's rate limits (see SetLimits).
func WithLimits(model string, l Limits) Option { return func(f *Fake) { f.limits[model] = l } }

// WithRetryDelay is the RetryInfo delay of the 429s that FailNext scripts (default one second).
func WithRetryDelay(d time.Duration) Option { return func(f *Fake) { f.retryDelay = d } }

// New returns a Fake; Close it to end held and in-flight generations.
func New(opts ...Option) *Fake {
	f := &Fake{
		log:         slog.New(slog.DiscardHandler),
		retryDelay:  time.Second,
		done:        make(chan struct{}),
		responder:   DefaultReply,
		latency:     make(map[string]Latency),
		limits:      make(map[string]Limits),
		windows:     make(map[string][]admitted),
		failures:    make(map[string][]int),
		outages:     make(map[string]time.Time),
		gates:       make(map[string]*Gate),
		rng:         rand.New(rand.NewPCG(1, 2)),
		shedding:    make(map[string]Shedding),
		fallback:    make(map[string]float64),
		implicit:    make(map[string]ImplicitCaching),
		seen:        make(map[string]time.Time),
		cacheMin:    make(map[string]int64),
		plans:       make(map[string]BatchPlan),
		batchScript: make(map[string][]string),
		batchLimit:  maxBody,
		uploads:     make(map[string]*pendingUpload),
		fileTTL:     FileTTL,
	}
	for _, o := range opts {
		o(f)
	}
	f.mux = http.NewServeMux()
	f.mux.HandleFunc("POST /{version}/models/{call}", f.serveModel)
	f.routeBatches()
	f.routeCaches()
	f.routeFiles()
	f.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		f.writeError(w, apiFailure{code: http.StatusNotFound, message: "The requested URL " + r.URL.Path + " was not found on this server."})
	})
	return f
}

// SetResponder replaces the Responder that decides every generation's output; nil restores
// DefaultReply.
func (f *Fake) SetResponder(r Responder) {
	if r == nil {
		r = DefaultReply
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.responder = r
}

// SetLatency sets how long a model's generations take.
func (f *Fake) SetLatency(model string, l Latency) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latency[model] = l
}

// SetLimits sets a model's RPM/TPM limits; the zero Limits removes them. Calls already admitted
// stay in the window.
func (f *Fake) SetLimits(model string, l Limits) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limits[model] = l
}

// FailNext appends to a model's failure schedule: each of the model's next generation calls
// (outside outages) takes one code and fails with it; 0 or 200 lets that call through. For
// example FailNext(m, 503, 503, 503) fails three calls and lets the fourth succeed. A scripted
// 429 carries a RetryInfo delay (WithRetryDelay).
func (f *Fake) FailNext(model string, codes ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures[model] = append(f.failures[model], codes...)
}

// OutageUntil fails a model's generation calls with 503 UNAVAILABLE until t.
func (f *Fake) OutageUntil(model string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outages[model] = t
}

// Outage fails a model's generation calls with 503 UNAVAILABLE for d from now.
func (f *Fake) Outage(model string, d time.Duration) { f.OutageUntil(model, time.Now().Add(d)) }

// Restore ends a model's outage now.
func (f *Fake) Restore(model string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.outages, model)
}

// Block holds the model's generation calls that arrive from now on (after admission, before
// generating) until the returned Gate is released. A later Block of the same model replaces the
// gate for later calls.
func (f *Fake) Block(model string) *Gate {
	g := &Gate{fake: f, model: model, entered: make(chan Request, 1024), released: make(chan struct{})}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gates[model] = g
	return g
}

// Ledger returns a snapshot of the calls and billed tokens so far, the storage of every cache and
// the batch jobs.
func (f *Fake) Ledger() Ledger {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.ledger.snapshot()
	for _, c := range f.caches {
		l.Caches = append(l.Caches, c.bill())
	}
	for _, b := range f.batches {
		l.Batches = append(l.Batches, b.record())
	}
	l.BatchesRefused = f.batchesRefused
	return l
}

// InFlight is the number of generations admitted and not yet finished (held, generating or
// streaming), whether or not their clients are still there.
func (f *Fake) InFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inflight
}

// WaitIdle waits until no generation is in flight, so that the Ledger includes every call made
// so far, including those whose clients had gone.
func (f *Fake) WaitIdle(ctx context.Context) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for f.InFlight() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d in-flight generations: %w", f.InFlight(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Close ends held and in-flight generations without billing them (they answer 503), and stops
// the batch jobs still running (they stay as they are, unbilled), so that an HTTP server in
// front of the fake can shut down. It is idempotent.
func (f *Fake) Close() {
	f.closeOnce.Do(func() {
		close(f.done)
		f.stopBatches()
	})
}

// ServeHTTP serves the Gemini API routes under /{version}/models/.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) { f.mux.ServeHTTP(w, r) }

// maxBody bounds a request body: Gemini's own limit, 20 MB, which bounds a batch job of inlined
// requests too.
const maxBody = 20 << 20

// readBody reads a request body of at most maxBody bytes; a larger one is refused as Gemini
// refuses it (400 INVALID_ARGUMENT, "Request payload size exceeds the limit: N bytes.").
func (f *Fake) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		f.writeError(w, payloadTooLarge(maxBody))
		return nil, false
	}
	if err != nil {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "Request payload could not be read: " + err.Error()})
		return nil, false
	}
	return body, true
}

// payloadTooLarge is Gemini's answer to a request body over limit bytes.
func payloadTooLarge(limit int) apiFailure {
	return apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("Request payload size exceeds the limit: %d bytes.", limit)}
}

func (f *Fake) serveModel(w http.ResponseWriter, r *http.Request) {
	model, method, ok := strings.Cut(r.PathValue("call"), ":")
	if !ok || model == "" {
		f.writeError(w, apiFailure{code: http.StatusNotFound, message: "The requested URL " + r.URL.Path + " was not found on this server."})
		return
	}
	if fail, ok := f.authorize(r); !ok {
		f.writeError(w, fail)
		return
	}
	switch method {
	case methodGenerate, methodStream, methodCountTokens, methodBatch:
	default:
		f.writeError(w, apiFailure{code: http.StatusNotFound, message: fmt.Sprintf("Method %q of models/%s is not found.", method, model)})
		return
	}
	if f.models != nil && !f.models[model] {
		f.writeError(w, apiFailure{code: http.StatusNotFound, message: fmt.Sprintf("models/%s is not found for API version %s, or is not supported for %s.", model, r.PathValue("version"), method)})
		return
	}
	if method == methodStream && r.URL.Query().Get("alt") != "sse" {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "The fake serves streamGenerateContent only with alt=sse."})
		return
	}
	body, ok := f.readBody(w, r)
	if !ok {
		return
	}
	if method == methodBatch {
		f.createBatch(w, model, body)
		return
	}
	req, err := decodeRequest(model, method, body)
	if err != nil {
		f.writeError(w, badRequest(err))
		return
	}
	if fail := f.prefix(&req, time.Now()); fail != nil {
		f.writeError(w, *fail)
		return
	}
	if fail := f.attachFiles(&req, time.Now()); fail != nil {
		f.writeError(w, *fail)
		return
	}
	if method == methodCountTokens {
		f.countTokens(w, req)
		return
	}
	f.generate(w, r, req)
}

func (f *Fake) authorize(r *http.Request) (apiFailure, bool) {
	key := r.Header.Get("x-goog-api-key")
	if key == "" {
		key = r.URL.Query().Get("key")
	}
	if key == "" {
		return apiFailure{code: http.StatusForbidden, message: "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API."}, false
	}
	if f.apiKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(f.apiKey)) != 1 {
		return apiFailure{code: http.StatusBadRequest, message: "API key not valid. Please pass a valid API key."}, false
	}
	return apiFailure{}, true
}

func (f *Fake) countTokens(w http.ResponseWriter, req Request) {
	f.mu.Lock()
	f.ledger.tally(req.Model).CountTokens++
	f.mu.Unlock()
	n := req.PromptTokens()
	f.log.Info("fake gemini call", "model", req.Model, "method", req.Method, "code", http.StatusOK, "prompt_tokens", n)
	writeJSON(w, http.StatusOK, map[string]any{
		"totalTokens":         n,
		"promptTokensDetails": []wireModalityUsed{{Modality: "TEXT", TokenCount: n}},
	})
}

// pick returns the control of model, or else the one of "" (every model).
func pick[V any](m map[string]V, model string) (V, bool) {
	if v, ok := m[model]; ok {
		return v, true
	}
	v, ok := m[""]
	return v, ok
}

// admit numbers the call and decides, under the lock, whether it fails before generating:
// outage, then the failure schedule, then the rate limits.
func (f *Fake) admit(req *Request, now time.Time) (fail *apiFailure, responder Responder, gate *Gate, latency Latency) {
	f.mu.Lock()
	defer f.mu.Unlock()
	req.Call = f.calls
	f.calls++
	t := f.ledger.tally(req.Model)
	t.Calls++
	defer func() {
		if fail != nil {
			t.Failed++
		}
	}()
	if until, ok := pick(f.outages, req.Model); ok && now.Before(until) {
		return &apiFailure{code: http.StatusServiceUnavailable}, nil, nil, Latency{}
	}
	key := req.Model
	if len(f.failures[key]) == 0 {
		key = ""
	}
	if q := f.failures[key]; len(q) > 0 {
		code := q[0]
		f.failures[key] = q[1:]
		if code != 0 && code != http.StatusOK {
			scripted := &apiFailure{code: code, model: req.Model}
			if code == http.StatusTooManyRequests {
				scripted.retryDelay = f.retryDelay
			}
			return scripted, nil, nil, Latency{}
		}
	}
	if l, ok := pick(f.limits, req.Model); ok {
		win, wait, quota := l.check(f.windows[req.Model], req.PromptTokens(), now)
		f.windows[req.Model] = win
		if quota != "" {
			return &apiFailure{code: http.StatusTooManyRequests, retryDelay: wait, quota: quota, model: req.Model,
				message: fmt.Sprintf("You exceeded your current quota, please check your plan and billing details. Quota exceeded for metric: generativelanguage.googleapis.com/%s, model: %s. Please retry in %s.", quota, req.Model, formatDuration(wait))}, nil, nil, Latency{}
		}
	}
	if shed := f.shed(*req); shed != nil {
		t.Shed++
		return shed, nil, nil, Latency{}
	}
	f.serveTier(req)
	f.implicitHit(req, now)
	latency, _ = pick(f.latency, req.Model)
	gate, _ = pick(f.gates, req.Model)
	f.inflight++
	return nil, f.responder, gate, latency
}

// generate serves generateContent and streamGenerateContent. Once admitted, the generation runs
// to its end on the fake's own clock, not the client's: a client that goes away is billed anyway.
func (f *Fake) generate(w http.ResponseWriter, r *http.Request, req Request) {
	start := time.Now()
	fail, responder, gate, lat := f.admit(&req, start)
	if fail != nil {
		f.logCall(req, fail.code, task.Usage{})
		f.writeError(w, *fail)
		return
	}
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	reply := responder(req)
	if reply.Code != 0 {
		f.fail(req, w, apiFailure{code: reply.Code, message: reply.Message, retryDelay: reply.RetryDelay, model: req.Model})
		return
	}
	latency := lat.draw(req, &f.mu, f.rng)
	if gate != nil {
		select {
		case gate.entered <- req:
		default:
		}
		select {
		case <-gate.released:
		case <-f.done:
			f.fail(req, w, apiFailure{code: http.StatusServiceUnavailable, message: "The fake Gemini server is shutting down."})
			return
		}
	}
	reply = reply.finalize()
	usage := usageOf(req, reply)
	chunks := []string{reply.Text}
	if req.Method == methodStream {
		chunks = split(reply.Text, 3)
		w.Header().Set("Content-Type", "text/event-stream")
	}
	respID := newHashStream(req).id() + fmt.Sprintf("-%d", req.Call)
	for i, c := range chunks {
		if !f.sleep(latency / time.Duration(len(chunks))) {
			shutdown := apiFailure{code: http.StatusServiceUnavailable, message: "The fake Gemini server is shutting down."}
			if i == 0 {
				f.fail(req, w, shutdown)
				return
			}
			// The stream has begun: the error goes in-band, as Gemini sends it.
			f.fail(req, nil, shutdown)
			b, _ := json.Marshal(shutdown.body()) // googleError always marshals
			_, _ = fmt.Fprintf(w, "data: %s\r\n\r\n", b)
			return
		}
		resp := wireResponse{
			Candidates:   []wireCandidate{{Content: wireContent{Role: "model", Parts: []wirePart{{Text: c}}}}},
			ModelVersion: req.Model,
			ResponseID:   respID,
		}
		if reply.BlockReason != "" {
			resp.Candidates = nil
			resp.PromptFeedback = &wirePromptFeedback{BlockReason: reply.BlockReason}
		}
		if i == len(chunks)-1 {
			if resp.Candidates != nil {
				resp.Candidates[0].FinishReason = reply.FinishReason
				if reply.ContinuationToken != "" {
					resp.Candidates[0].ContinuationToken = []byte(reply.ContinuationToken)
				}
			}
			resp.UsageMetadata = wireUsageOf(usage, req.Tier)
			f.bill(Bill{Request: req, Usage: usage, Tier: req.Tier, Abandoned: r.Context().Err() != nil, Started: start})
		}
		if req.Method != methodStream {
			writeJSON(w, http.StatusOK, resp)
			break
		}
		b, _ := json.Marshal(resp) // wireResponse always marshals
		// Write errors mean the client has gone; the generation goes on and is billed.
		_, _ = fmt.Fprintf(w, "data: %s\r\n\r\n", b)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}
}

// sleep waits d on the fake's clock; false means the fake was closed.
func (f *Fake) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-f.done:
		return false
	}
}

// fail records a failed generation and, when w is not nil, answers it.
func (f *Fake) fail(req Request, w http.ResponseWriter, fail apiFailure) {
	f.mu.Lock()
	f.ledger.tally(req.Model).Failed++
	f.mu.Unlock()
	f.logCall(req, fail.code, task.Usage{})
	if w != nil {
		f.writeError(w, fail)
	}
}

func (f *Fake) bill(b Bill) {
	f.mu.Lock()
	t := f.ledger.tally(b.Request.Model)
	t.Generations++
	t.Billed = t.Billed.Add(b.Usage)
	if b.Abandoned {
		t.Abandoned++
	}
	f.ledger.bills = append(f.ledger.bills, b)
	f.mu.Unlock()
	f.logCall(b.Request, http.StatusOK, b.Usage)
}

func (f *Fake) logCall(req Request, code int, u task.Usage) {
	f.log.Info("fake gemini call", "model", req.Model, "method", req.Method, "call", req.Call, "code", code,
		"prompt_tokens", u.PromptTokens, "output_tokens", u.OutputTokens)
}

// split cuts s into at most n non-empty pieces at rune boundaries (one piece when s is short).
func split(s string, n int) []string {
	size := (len(s) + n - 1) / n
	var out []string
	for len(s) > size && size > 0 {
		cut := size
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return append(out, s)
}

func (f *Fake) writeError(w http.ResponseWriter, fail apiFailure) {
	writeJSON(w, fail.code, fail.body())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":{"code":500,"message":"fake: cannot encode the answer","status":"INTERNAL"}}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
