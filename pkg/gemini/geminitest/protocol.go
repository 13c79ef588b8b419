package geminitest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// errBadRequest is wrapped by every error of decodeRequest: the body is not a request Gemini
// would accept, and the fake answers 400 INVALID_ARGUMENT.
var errBadRequest = errors.New("invalid request")

// wireRequest is the body of generateContent, streamGenerateContent and countTokens, with only
// the fields the fake reads; unknown fields are ignored, as the SDK may send more.
type wireRequest struct {
	Contents          []wireContent  `json:"contents"`
	SystemInstruction *wireContent   `json:"systemInstruction"`
	GenerationConfig  *wireGenConfig `json:"generationConfig"`
	// ServiceTier is "flex", "standard" or "priority" (any case; absent is standard). The SDK
	// sends GenerateContentConfig.ServiceTier here, beside generationConfig.
	ServiceTier string `json:"serviceTier"`
	// CachedContent names a cachedContents resource whose content prefixes this request's.
	CachedContent string `json:"cachedContent"`
	// ContinuationToken resumes an answer that ended with finishReason CONTINUATION.
	ContinuationToken []byte `json:"continuationToken"`
	// GenerateContentRequest is countTokens' alternative form: a whole generate request.
	GenerateContentRequest *wireRequest `json:"generateContentRequest"`
}

type wireContent struct {
	Role  string     `json:"role,omitempty"`
	Parts []wirePart `json:"parts"`
}

type wirePart struct {
	Text     string        `json:"text,omitempty"`
	FileData *wireFileData `json:"fileData,omitempty"`
}

type wireFileData struct {
	MIMEType string `json:"mimeType"`
	FileURI  string `json:"fileUri"`
}

type wireGenConfig struct {
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"topP"`
	MaxOutputTokens    *int            `json:"maxOutputTokens"`
	ResponseMIMEType   string          `json:"responseMimeType"`
	ResponseSchema     json.RawMessage `json:"responseSchema"`
	ResponseJSONSchema json.RawMessage `json:"responseJsonSchema"`
}

// Request is a decoded generation or countTokens call, as a Responder and the ledger see it.
type Request struct {
	// Model is the model id from the URL, without the "models/" prefix.
	Model string
	// Method is "generateContent", "streamGenerateContent", "countTokens", or
	// "batchGenerateContent" for a request of a batch job.
	Method string
	// Call is the 0-based index of this generation call among all generation calls the fake
	// received, in arrival order (countTokens calls are not numbered and get -1).
	Call              int
	SystemInstruction string
	// Prompt is the text of every part of every content, joined by newlines.
	Prompt string
	// Temperature is nil when the request did not set one.
	Temperature     *float64
	MaxOutputTokens int // 0 when not set
	// ResponseMIMEType is generationConfig.responseMimeType ("" means text/plain).
	ResponseMIMEType string
	// ResponseSchema is the decoded responseJsonSchema, or else responseSchema; nil when absent.
	ResponseSchema any
	// Tier is the service tier asked for — TierStandard, TierFlex or TierPriority (batch requests:
	// TierBatch) — and, once the call is admitted, the tier serving it: a priority request may be
	// served on the standard tier (SetPriorityFallback).
	Tier string
	// CachedContent is the cachedContents resource the request named, "" when none. Its system
	// instruction and contents are part of SystemInstruction and Prompt: a request answers the
	// same with its prefix cached or sent whole.
	CachedContent string
	// CachedTokens is the part of PromptTokens served from a cache: the explicit cache's tokens,
	// or an implicit cache hit on the system instruction.
	CachedTokens int64
	// Batch is the batches/{id} job the request ran in, "" for an online call.
	Batch string
	// Continuation is the continuation token the request resumes from, "" for a first request.
	Continuation string
	// Files are the files of the request's fileData parts, as the fake read them, after those
	// of its cache.
	Files []File

	// own is the token count of the request's own content, without its cached prefix.
	own int64
	// fileRefs are the fileData parts, resolved into Files by attachFiles; fileTokens their
	// tokens by modality.
	fileRefs   []wireFileData
	fileTokens map[string]int64
	// cachedFileTokens are the tokens by modality of the files of its cache, part of
	// CachedTokens.
	cachedFileTokens map[string]int64
}

// PromptTokens is the prompt's token count as the fake reports and bills it; with a cached
// prefix, the cache's tokens plus the request's own.
func (r Request) PromptTokens() int64 {
	var files int64
	for _, n := range r.fileTokens {
		files += n
	}
	if r.CachedContent != "" {
		return r.CachedTokens + r.own + files
	}
	return tokens(r.SystemInstruction) + tokens(r.Prompt) + files
}

// tokens is the fake's deterministic tokenizer: about one token per four bytes, at least one for
// any non-empty text.
func tokens(text string) int64 {
	if text == "" {
		return 0
	}
	return int64(max(1, (len(text)+3)/4))
}

// decodeRequest decodes the JSON body of a call to model's method. Every failure wraps
// errBadRequest and carries a message fit for a Google error answer.
func decodeRequest(model, method string, body []byte) (Request, error) {
	var w wireRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&w); err != nil {
		return Request{}, fmt.Errorf("%w: Invalid JSON payload received. %w", errBadRequest, err)
	}
	if dec.More() {
		return Request{}, fmt.Errorf("%w: Invalid JSON payload received. Unexpected data after the request object", errBadRequest)
	}
	if method == methodCountTokens && w.GenerateContentRequest != nil {
		w = *w.GenerateContentRequest
	}
	r := Request{Model: model, Method: method, Call: -1, CachedContent: w.CachedContent, Continuation: string(w.ContinuationToken)}
	tier, err := decodeTier(w.ServiceTier)
	if err != nil {
		return Request{}, err
	}
	r.Tier = tier
	if w.CachedContent != "" && w.SystemInstruction != nil {
		return Request{}, fmt.Errorf("%w: CachedContent can not be used with GenerateContent request setting system_instruction, tools or tool_config.\n\nProposed fix: move those values to CachedContent from GenerateContent request.", errBadRequest) //nolint:staticcheck // ST1005: the real API's message, word for word
	}
	if len(w.Contents) == 0 {
		return Request{}, fmt.Errorf("%w: * GenerateContentRequest.contents: contents is not specified", errBadRequest)
	}
	var texts []string
	for i, c := range w.Contents {
		if c.Role != "" && c.Role != "user" && c.Role != "model" {
			return Request{}, fmt.Errorf("%w: * GenerateContentRequest.contents[%d].role: Please use a valid role: user, model.", errBadRequest, i) //nolint:staticcheck // ST1005: the real API's message, word for word
		}
		if len(c.Parts) == 0 {
			return Request{}, fmt.Errorf("%w: * GenerateContentRequest.contents[%d].parts: contents.parts must not be empty.", errBadRequest, i) //nolint:staticcheck // ST1005: the real API's message, word for word
		}
		texts = append(texts, c.text())
		for j, p := range c.Parts {
			if p.FileData == nil {
				continue
			}
			if p.FileData.FileURI == "" || p.FileData.MIMEType == "" {
				return Request{}, fmt.Errorf("%w: * GenerateContentRequest.contents[%d].parts[%d].file_data: file_uri and mime_type are required", errBadRequest, i, j)
			}
			r.fileRefs = append(r.fileRefs, *p.FileData)
		}
	}
	r.Prompt = strings.Join(texts, "\n")
	if w.SystemInstruction != nil {
		r.SystemInstruction = w.SystemInstruction.text()
	}
	r.own = tokens(r.SystemInstruction) + tokens(r.Prompt)
	if g := w.GenerationConfig; g != nil {
		if g.Temperature != nil && (*g.Temperature < 0 || *g.Temperature > 2 || math.IsNaN(*g.Temperature)) {
			return Request{}, fmt.Errorf("%w: * GenerateContentRequest.generation_config.temperature: must be in [0.0, 2.0]", errBadRequest)
		}
		if g.MaxOutputTokens != nil && *g.MaxOutputTokens < 0 {
			return Request{}, fmt.Errorf("%w: * GenerateContentRequest.generation_config.max_output_tokens: must be positive", errBadRequest)
		}
		r.Temperature = g.Temperature
		if g.MaxOutputTokens != nil {
			r.MaxOutputTokens = *g.MaxOutputTokens
		}
		switch g.ResponseMIMEType {
		case "", mimeText, mimeJSON, mimeEnum:
		default:
			return Request{}, fmt.Errorf("%w: * GenerateContentRequest.generation_config.response_mime_type: allowed mimetypes are `text/plain`, `application/json` and `text/x.enum`, got %q", errBadRequest, g.ResponseMIMEType)
		}
		r.ResponseMIMEType = g.ResponseMIMEType
		raw := g.ResponseJSONSchema
		if len(raw) == 0 || string(raw) == "null" {
			raw = g.ResponseSchema
		}
		if len(raw) > 0 && string(raw) != "null" {
			if r.ResponseMIMEType != mimeJSON && r.ResponseMIMEType != mimeEnum {
				return Request{}, fmt.Errorf("%w: * GenerateContentRequest.generation_config.response_mime_type: a response schema needs response_mime_type application/json or text/x.enum", errBadRequest)
			}
			if err := json.Unmarshal(raw, &r.ResponseSchema); err != nil {
				return Request{}, fmt.Errorf("%w: * GenerateContentRequest.generation_config.response_schema: %w", errBadRequest, err)
			}
			if _, ok := r.ResponseSchema.(map[string]any); !ok {
				return Request{}, fmt.Errorf("%w: * GenerateContentRequest.generation_config.response_schema: must be an object", errBadRequest)
			}
		}
	}
	return r, nil
}

func (c wireContent) text() string {
	parts := make([]string, 0, len(c.Parts))
	for _, p := range c.Parts {
		parts = append(parts, p.Text)
	}
	return strings.Join(parts, "")
}

// Response MIME types Gemini accepts.
const (
	mimeText = "text/plain"
	mimeJSON = "application/json"
	mimeEnum = "text/x.enum"
)

// Methods of the model routes.
const (
	methodGenerate    = "generateContent"
	methodStream      = "streamGenerateContent"
	methodCountTokens = "countTokens"
	methodBatch       = "batchGenerateContent"
)

// Service tiers, as Request.Tier and Bill.Tier name them: gemini.Tier's values.
const (
	TierStandard = string(gemini.TierStandard)
	TierFlex     = string(gemini.TierFlex)
	TierBatch    = string(gemini.TierBatch)
	TierPriority = string(gemini.TierPriority)
)

// Traffic types of usageMetadata.trafficType: which tier served a call.
const (
	trafficOnDemand = "ON_DEMAND"
	trafficFlex     = "ON_DEMAND_FLEX"
	trafficPriority = "ON_DEMAND_PRIORITY"
)

// decodeTier reads a request's serviceTier.
func decodeTier(s string) (string, error) {
	switch strings.ToLower(s) {
	case "", "unspecified", "standard":
		return TierStandard, nil
	case "flex":
		return TierFlex, nil
	case "priority":
		return TierPriority, nil
	}
	return "", fmt.Errorf("%w: * GenerateContentRequest.service_tier: unknown service tier %q", errBadRequest, s)
}

// wireResponse is a GenerateContentResponse, whole or one SSE chunk of it.
type wireResponse struct {
	Candidates     []wireCandidate     `json:"candidates,omitempty"`
	PromptFeedback *wirePromptFeedback `json:"promptFeedback,omitempty"`
	UsageMetadata  *wireUsage          `json:"usageMetadata,omitempty"`
	ModelVersion   string              `json:"modelVersion"`
	ResponseID     string              `json:"responseId"`
}

type wirePromptFeedback struct {
	BlockReason string `json:"blockReason"`
}

type wireCandidate struct {
	Content      wireContent `json:"content"`
	FinishReason string      `json:"finishReason,omitempty"`
	Index        int         `json:"index"`
	// ContinuationToken, with finishReason CONTINUATION, says the answer stopped early and a
	// request carrying the token would resume it (Reply.ContinuationToken).
	ContinuationToken []byte `json:"continuationToken,omitempty"`
}

type wireUsage struct {
	PromptTokenCount        int64              `json:"promptTokenCount"`
	CachedContentTokenCount int64              `json:"cachedContentTokenCount,omitempty"`
	CandidatesTokenCount    int64              `json:"candidatesTokenCount"`
	TotalTokenCount         int64              `json:"totalTokenCount"`
	PromptTokensDetails     []wireModalityUsed `json:"promptTokensDetails,omitempty"`
	CacheTokensDetails      []wireModalityUsed `json:"cacheTokensDetails,omitempty"`
	TrafficType             string             `json:"trafficType,omitempty"`
}

type wireModalityUsed struct {
	Modality   string `json:"modality"`
	TokenCount int64  `json:"tokenCount"`
}

// googleError is the body of every failed call: {"error":{"code","message","status","details"}}.
type googleError struct {
	Error googleErrorBody `json:"error"`
}

type googleErrorBody struct {
	Code    int              `json:"code"`
	Message string           `json:"message"`
	Status  string           `json:"status"`
	Details []map[string]any `json:"details,omitempty"`
}

// statusOf maps an HTTP status to the google.rpc.Code name Gemini sends with it.
func statusOf(code int) string {
	switch code {
	case http.StatusBadRequest:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusConflict:
		return "ABORTED"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusNotImplemented:
		return "UNIMPLEMENTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	}
	if code >= 500 {
		return "INTERNAL"
	}
	return "FAILED_PRECONDITION"
}

// defaultMessage is what Gemini says with a status when nothing more specific applies.
func defaultMessage(code int) string {
	switch code {
	case http.StatusTooManyRequests:
		return "Resource has been exhausted (e.g. check quota)."
	case http.StatusServiceUnavailable:
		return "The model is overloaded. Please try again later."
	case http.StatusInternalServerError:
		return "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"
	case http.StatusGatewayTimeout:
		return "Deadline expired before operation could complete."
	}
	return http.StatusText(code)
}

// apiFailure is a call the fake answers with a Google error.
type apiFailure struct {
	code       int
	message    string
	retryDelay time.Duration // > 0 adds a google.rpc.RetryInfo detail
	quota      string        // the quota metric of a 429, when a limit was hit
	model      string
}

func (f apiFailure) body() googleError {
	msg := f.message
	if msg == "" {
		msg = defaultMessage(f.code)
	}
	b := googleErrorBody{Code: f.code, Message: msg, Status: statusOf(f.code)}
	if f.quota != "" {
		b.Details = append(b.Details, map[string]any{
			"@type": "type.googleapis.com/google.rpc.QuotaFailure",
			"violations": []any{map[string]any{
				"quotaMetric":     "generativelanguage.googleapis.com/" + f.quota,
				"quotaId":         f.quota,
				"quotaDimensions": map[string]any{"location": "global", "model": f.model},
			}},
		})
	}
	if f.retryDelay > 0 {
		b.Details = append(b.Details, map[string]any{
			"@type":      "type.googleapis.com/google.rpc.RetryInfo",
			"retryDelay": formatDuration(f.retryDelay),
		})
	}
	return googleError{Error: b}
}

// formatDuration renders d as a google.protobuf.Duration in its JSON form ("2s", "0.250s"),
// rounded up to the millisecond so that a client honoring it never comes back too early.
func formatDuration(d time.Duration) string {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms%1000 == 0 {
		return strconv.FormatInt(int64(ms/1000), 10) + "s"
	}
	return fmt.Sprintf("%d.%03ds", ms/1000, ms%1000)
}
