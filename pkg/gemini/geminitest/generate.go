package geminitest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Reply is what a Responder decides for one generation call.
type Reply struct {
	// Text is the model's output.
	Text string
	// FinishReason is the candidate's finishReason; "" means "STOP". "SAFETY" with an empty Text
	// is a response blocked by the safety filters.
	FinishReason string
	// BlockReason, when set (e.g. "SAFETY"), blocks the prompt: the answer has no candidates and
	// promptFeedback.blockReason; only the prompt tokens are billed.
	BlockReason string
	// Code, when non-zero, fails the call with this HTTP status and a Google error body
	// (Message, and RetryDelay as a RetryInfo detail) instead of answering. A failed call is not billed.
	Code       int
	Message    string
	RetryDelay time.Duration
	// ContinuationToken, when set, ends the answer early as a resumable one: the response carries
	// it with finishReason CONTINUATION, which an SDK with automatic continuation would follow by
	// sending the request again (another billed call).
	ContinuationToken string
}

// Responder scripts the output of generation calls, e.g. invalid JSON on call 0 and
// DefaultReply(r) after. It is called concurrently and must be safe for concurrent use.
type Responder func(r Request) Reply

// DefaultReply is the fake's own answer: a short text derived from a hash of the whole request
// (with the size and SHA-256 of each file it read),
// or, when r asks for application/json, a JSON value satisfying its schema ({"answer": text}
// without a schema; text/x.enum: the
// schema's first enum value). A maxOutputTokens below the output's size truncates it with
// finishReason MAX_TOKENS, as Gemini does, which may leave JSON invalid.
func DefaultReply(r Request) Reply {
	h := newHashStream(r)
	var text string
	switch r.ResponseMIMEType {
	case mimeJSON:
		var v any = map[string]any{"answer": sentence(r.Model, h)}
		if r.ResponseSchema != nil {
			v = (&sampler{root: r.ResponseSchema, h: h}).sample(r.ResponseSchema, 0)
		}
		b, err := json.Marshal(v)
		if err != nil { // unreachable: the sampler builds only marshalable values
			b = []byte("{}")
		}
		text = string(b)
	case mimeEnum:
		text = enumText(r.ResponseSchema)
	default:
		text = sentence(r.Model, h)
		for _, fl := range r.Files {
			text += fmt.Sprintf(" [read %s: %d bytes, sha256 %s]", fl.MIMEType, fl.Size, fl.SHA256)
		}
	}
	reply := Reply{Text: text}
	if r.MaxOutputTokens > 0 && tokens(text) > int64(r.MaxOutputTokens) {
		reply.Text = truncate(text, 4*r.MaxOutputTokens)
		reply.FinishReason = "MAX_TOKENS"
	}
	return reply
}

var words = strings.Fields(`alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima
mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber
basalt cedar dune ember fjord granite harbor island jasper kelp lagoon meadow nectar orchard`)

func sentence(model string, h *hashStream) string {
	n := 6 + int(h.next()%18)
	out := make([]string, 0, n)
	for range n {
		out = append(out, words[h.next()%uint64(len(words))])
	}
	return fmt.Sprintf("Fake %s answer %s: %s.", model, h.id(), strings.Join(out, " "))
}

func enumText(schema any) string {
	if m, ok := schema.(map[string]any); ok {
		if e, ok := m["enum"].([]any); ok && len(e) > 0 {
			return fmt.Sprint(e[0])
		}
	}
	return ""
}

// truncate cuts s to at most n bytes at a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// hashStream is a deterministic stream of numbers seeded by the request.
type hashStream struct {
	seed [32]byte
	ctr  uint64
}

func newHashStream(r Request) *hashStream {
	schema, _ := json.Marshal(r.ResponseSchema)
	temp := "unset"
	if r.Temperature != nil {
		temp = strconv.FormatFloat(*r.Temperature, 'g', -1, 64)
	}
	parts := []string{r.Model, r.SystemInstruction, r.Prompt, temp, strconv.Itoa(r.MaxOutputTokens), r.ResponseMIMEType, string(schema)}
	for _, fl := range r.Files {
		parts = append(parts, fl.MIMEType+":"+fl.SHA256)
	}
	key := strings.Join(parts, "\x00")
	return &hashStream{seed: sha256.Sum256([]byte(key))}
}

func (h *hashStream) next() uint64 {
	var b [40]byte
	copy(b[:], h.seed[:])
	binary.BigEndian.PutUint64(b[32:], h.ctr)
	h.ctr++
	sum := sha256.Sum256(b[:])
	return binary.BigEndian.Uint64(sum[:8])
}

// id is a short hex name of the request, the same for the same request.
func (h *hashStream) id() string { return hex.EncodeToString(h.seed[:4]) }

// Bounds on the work of one sample, against nested, self-referencing or huge schemas: past
// them the sampler answers null.
const (
	maxSchemaDepth = 12
	maxNodes       = 10000
)

// sampler builds a value satisfying a schema; root resolves $refs.
type sampler struct {
	root  any
	h     *hashStream
	nodes int
}

// sample builds a value satisfying schema, which may be a JSON Schema (responseJsonSchema)
// or Gemini's OpenAPI-style Schema (responseSchema, upper-case types): objects with every
// property, the first enum value or const, numbers within minimum/maximum, arrays within
// minItems/maxItems, strings within minLength/maxLength, the first branch of anyOf/oneOf, and
// local $refs into $defs/definitions.
func (p *sampler) sample(schema any, depth int) any {
	p.nodes++
	s, ok := schema.(map[string]any)
	if !ok || depth > maxSchemaDepth || p.nodes > maxNodes {
		return nil
	}
	h := p.h
	if ref, ok := s["$ref"].(string); ok {
		return p.sample(resolveRef(p.root, ref), depth+1)
	}
	if c, ok := s["const"]; ok {
		return c
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		if branches, ok := s[k].([]any); ok && len(branches) > 0 {
			return p.sample(firstNonNull(branches), depth+1)
		}
	}
	switch schemaType(s) {
	case "object":
		props, _ := s["properties"].(map[string]any)
		out := make(map[string]any, len(props))
		keys := make([]string, 0, len(props))
		for k := range props {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			out[k] = p.sample(props[k], depth+1)
		}
		for _, k := range stringsOf(s["required"]) {
			if _, ok := out[k]; !ok {
				out[k] = sentence("value", h)
			}
		}
		return out
	case "array":
		n := 1
		if lo, ok := number(s["minItems"]); ok && lo > 1 {
			n = int(min(lo, 16))
		}
		if hi, ok := number(s["maxItems"]); ok && float64(n) > hi {
			n = max(0, int(hi))
		}
		out := make([]any, 0, n)
		for range n {
			out = append(out, p.sample(s["items"], depth+1))
		}
		return out
	case "integer":
		lo, hi := bounds(s, true)
		if hi < lo {
			return int64(lo)
		}
		return int64(lo) + int64(h.next()%uint64(hi-lo+1))
	case "number":
		lo, hi := bounds(s, false)
		if hi < lo {
			return lo
		}
		v := lo + (hi-lo)*float64(h.next()%1000)/1000
		return math.Round(v*1000) / 1000
	case "boolean":
		return h.next()%2 == 0
	case "null":
		return nil
	}
	return sampleString(s, h)
}

func sampleString(s map[string]any, h *hashStream) string {
	var v string
	switch s["format"] {
	case "date-time":
		v = "2026-01-01T00:00:00Z"
	case "date":
		v = "2026-01-01"
	case "time":
		v = "00:00:00"
	case "email":
		v = "fake-" + h.id() + "@example.com"
	case "uri", "url":
		v = "https://example.com/" + h.id()
	case "uuid":
		v = "00000000-0000-4000-8000-0000" + h.id()
	default:
		v = words[h.next()%uint64(len(words))] + " " + h.id()
	}
	if lo, ok := number(s["minLength"]); ok && float64(utf8.RuneCountInString(v)) < lo {
		v += strings.Repeat("x", int(min(lo, 1<<12))-utf8.RuneCountInString(v))
	}
	if hi, ok := number(s["maxLength"]); ok && float64(utf8.RuneCountInString(v)) > hi {
		v = string([]rune(v)[:max(0, int(hi))])
	}
	return v
}

// schemaType returns the lower-case type of s, inferred when absent.
func schemaType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return strings.ToLower(t)
	case []any:
		if first, ok := firstNonNull(t).(string); ok {
			return strings.ToLower(first)
		}
	}
	if _, ok := s["properties"]; ok {
		return "object"
	}
	if _, ok := s["items"]; ok {
		return "array"
	}
	return "string"
}

// firstNonNull returns the first element that is not the null type, or the first element.
func firstNonNull(xs []any) any {
	for _, x := range xs {
		switch v := x.(type) {
		case string:
			if !strings.EqualFold(v, "null") {
				return v
			}
		case map[string]any:
			if t, ok := v["type"].(string); !ok || !strings.EqualFold(t, "null") {
				return v
			}
		}
	}
	return xs[0]
}

func resolveRef(root any, ref string) any {
	node := root
	path, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil
	}
	for _, seg := range strings.Split(path, "/") {
		m, ok := node.(map[string]any)
		if !ok {
			return nil
		}
		node = m[strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")]
	}
	return node
}

// bounds returns the inclusive range of a number schema, with a default span of 100.
func bounds(s map[string]any, integer bool) (lo, hi float64) {
	const span = 100
	lo, hasLo := number(s["minimum"])
	hi, hasHi := number(s["maximum"])
	if x, ok := number(s["exclusiveMinimum"]); ok {
		hasLo = true
		if integer {
			lo = math.Floor(x) + 1
		} else {
			lo = x + math.Max(math.Abs(x)*1e-9, 1e-3)
		}
	}
	if x, ok := number(s["exclusiveMaximum"]); ok {
		hasHi = true
		if integer {
			hi = math.Ceil(x) - 1
		} else {
			hi = x - math.Max(math.Abs(x)*1e-9, 1e-3)
		}
	}
	switch {
	case !hasLo && !hasHi:
		lo, hi = 0, span
	case !hasLo:
		lo = math.Min(0, hi-span)
	case !hasHi:
		hi = lo + span
	}
	if integer {
		lo, hi = math.Ceil(lo), math.Floor(hi)
	}
	// Keep int64 conversions and the modulo span finite for absurd bounds.
	lo, hi = math.Max(lo, -1e15), math.Min(hi, 1e15)
	return lo, hi
}

// number reads a JSON number, or a string holding one (Gemini's Schema sends int64 fields such
// as minItems as strings).
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, !math.IsNaN(n) && !math.IsInf(n, 0)
	case string:
		f, err := strconv.ParseFloat(n, 64)
		return f, err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	return 0, false
}

func stringsOf(v any) []string {
	xs, _ := v.([]any)
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
