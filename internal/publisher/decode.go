package publisher

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Request limits. Input, the largest output a model may return (max_output_tokens) and a bounded
// history of replays must stay well under Firestore's 1 MiB document limit.
const (
	MaxInputBytes      = 256 << 10
	MaxLabels          = 32
	maxLabelKey        = 63
	maxLabelValue      = 256
	maxSubjectKey      = 512
	maxCallbackURL     = 2048
	maxNameLen         = 64
	maxIdempotencyKey  = 255
	maxMaxOutputTokens = 65536
	maxTopK            = 100
)

var (
	labelKeyRE = regexp.MustCompile(`^[a-z][a-z0-9_.-]*$`)
	nameRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)
)

// readBody reads a JSON body of at most limit bytes that is valid UTF-8 (the JSON decoder would
// silently replace invalid bytes).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, httpapi.Problem(http.StatusUnsupportedMediaType, httpapi.TypeMedia, "the body must be application/json")
		}
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, err
	}
	if !utf8.Valid(data) {
		return nil, httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "the body is not valid UTF-8")
	}
	return data, nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and trailing data; its
// problems name the field.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeProblem(err, data)
	}
	if _, err := dec.Token(); err != io.EOF {
		return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "the body holds more than one JSON value")
	}
	return nil
}

func decodeProblem(err error, data []byte) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	var pe *time.ParseError
	switch {
	case errors.Is(err, io.EOF):
		return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "the body is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "the body is truncated JSON")
	case errors.As(err, &se):
		return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, fmt.Sprintf("malformed JSON at byte %d", se.Offset))
	case errors.As(err, &te):
		if te.Field == "" {
			return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, fmt.Sprintf("the body must be %s, not %s", jsonKind(te.Type), te.Value))
		}
		return fieldProblem(te.Field, "must be %s, not %s", jsonKind(te.Type), te.Value)
	case errors.As(err, &pe), strings.HasPrefix(err.Error(), "Time.UnmarshalJSON"):
		// encoding/json does not say which field a time.Time's own decoding refused.
		if f := timeField(data); f != "" {
			return fieldProblem(f, "must be an RFC 3339 timestamp")
		}
		return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "a timestamp is not RFC 3339")
	}
	const unknown = "json: unknown field "
	if msg := err.Error(); strings.HasPrefix(msg, unknown) {
		// encoding/json has no typed error for DisallowUnknownFields.
		name := strings.Trim(strings.TrimPrefix(msg, unknown), `"`)
		return fieldProblem(name, "unknown field")
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return err
	}
	return httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, "the body is not valid JSON")
}

// timeFields are the request's timestamps.
var timeFields = []string{"run_before", "start_after"}

// timeField names the first of the body's timestamps that does not decode, or "".
func timeField(data []byte) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return ""
	}
	for _, name := range timeFields {
		var t time.Time
		if raw, ok := fields[name]; ok && json.Unmarshal(raw, &t) != nil {
			return name
		}
	}
	return ""
}

// jsonKind names a Go type the way a JSON client thinks of it, by its kind: a named string type
// (a mode, a state) is a string, a struct an object, whatever its package.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return t.String()
}

// validator checks a decoded request against the API's rules.
type validator struct {
	families      Families
	checkCallback func(rawURL string) error
	now           time.Time
	maxFiles      int
}

// normalize fills defaults so equal intents hash alike.
func normalize(req *task.Request) {
	if req.Variant == "" {
		req.Variant = prompts.DefaultVariant
	}
	if req.RunBefore != nil {
		rb := req.RunBefore.UTC()
		req.RunBefore = &rb
	}
	if req.StartAfter != nil {
		sa := req.StartAfter.UTC()
		req.StartAfter = &sa
	}
	if len(req.Labels) == 0 {
		req.Labels = nil
	}
}

// validate returns the request's resolved family variant, or a 400 problem naming every refused
// field; a request whose only fault is a well-formed callback URL the policy forbids is a 422.
func (v validator) validate(req *task.Request) (variant *prompts.Variant, err error) {
	var fs []task.FieldError
	var refused *task.FieldError
	bad := func(field, format string, args ...any) {
		fs = append(fs, task.FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
	}
	switch {
	case req.Family == "":
		bad("family", "is required")
	case len(req.Family) > maxNameLen || !nameRE.MatchString(req.Family):
		bad("family", "must be up to %d characters of a-z, 0-9, '_', '.', '-'", maxNameLen)
	case len(req.Variant) > maxNameLen || !nameRE.MatchString(req.Variant):
		bad("variant", "must be up to %d characters of a-z, 0-9, '_', '.', '-'", maxNameLen)
	default:
		fam, err := v.families.Variant(req.Family, req.Variant)
		_, defErr := v.families.Variant(req.Family, prompts.DefaultVariant)
		switch {
		case err != nil && defErr == nil:
			bad("variant", "family %q has no variant %q", req.Family, req.Variant)
		case err != nil:
			bad("family", "unknown family %q", req.Family)
		case req.Config != nil && req.Config.MaxOutputTokens != nil && fam.MaxOutputTokensLimit > 0 && *req.Config.MaxOutputTokens > fam.MaxOutputTokensLimit:
			bad("config.max_output_tokens", "family %q allows at most %d", req.Family, fam.MaxOutputTokensLimit)
		}
		variant = fam
	}
	v.checkFiles(req, variant, bad)
	switch {
	case req.Input == "" && len(req.Files) == 0:
		bad("input", "is required (or files, for a family that reads them)")
	case len(req.Input) > MaxInputBytes:
		bad("input", "is %d bytes; at most %d are accepted", len(req.Input), MaxInputBytes)
	}
	if len(req.SubjectKey) > maxSubjectKey {
		bad("subject_key", "must be at most %d bytes", maxSubjectKey)
	}
	if req.CallbackURL != "" {
		if len(req.CallbackURL) > maxCallbackURL {
			bad("callback_url", "must be at most %d bytes", maxCallbackURL)
		} else if err := v.checkCallback(req.CallbackURL); err != nil {
			if b, ok := ssrf.IsBlocked(err); ok && b.Reason != ssrf.ReasonURL && b.Reason != ssrf.ReasonNoHost {
				refused = &task.FieldError{Field: "callback_url", Detail: err.Error()}
			} else {
				bad("callback_url", "%v", err)
			}
		}
	}
	if c := req.Config; c != nil {
		rangeF := func(field string, p *float64, lo, hi float64) {
			if p != nil && (math.IsNaN(*p) || *p < lo || *p > hi) {
				bad(field, "must be between %g and %g", lo, hi)
			}
		}
		rangeF("config.temperature", c.Temperature, 0, 2)
		rangeF("config.top_p", c.TopP, 0, 1)
		if c.TopK != nil && (*c.TopK < 1 || *c.TopK > maxTopK) {
			bad("config.top_k", "must be between 1 and %d", maxTopK)
		}
		if c.MaxOutputTokens != nil && (*c.MaxOutputTokens < 1 || *c.MaxOutputTokens > maxMaxOutputTokens) {
			bad("config.max_output_tokens", "must be between 1 and %d", maxMaxOutputTokens)
		}
	}
	if len(req.Labels) > MaxLabels {
		bad("labels", "at most %d labels", MaxLabels)
	}
	for k, val := range req.Labels {
		if len(k) > maxLabelKey || !labelKeyRE.MatchString(k) {
			bad("labels."+k, "a label key is up to %d characters of a-z, 0-9, '_', '.', '-', starting with a letter", maxLabelKey)
		}
		if len(val) > maxLabelValue || strings.IndexFunc(val, unicode.IsControl) >= 0 {
			bad("labels."+k, "a label value is up to %d bytes without control characters", maxLabelValue)
		}
	}
	if req.RunBefore != nil && !req.RunBefore.After(v.now) {
		bad("run_before", "must be in the future")
	}
	fs = append(fs, checkStart(req, v.now)...)
	if m := req.MaxCostUSD; m != nil && (!(*m > 0) || math.IsInf(*m, 0)) {
		bad("max_cost_usd", "must be greater than 0")
	}
	if req.Mode != "" && !req.Mode.Valid() {
		bad("mode", "must be one of %v", task.Modes)
	}
	if p := req.Priority; p != nil && (*p < task.MinPriority || *p > task.MaxPriority) {
		bad("priority", "must be between %d and %d", task.MinPriority, task.MaxPriority)
	}
	if len(fs) == 0 && refused != nil {
		return nil, httpapi.Problem(http.StatusUnprocessableEntity, probCallbackRefused, "callback_url: "+refused.Detail, *refused)
	}
	if refused != nil {
		fs = append(fs, *refused)
	}
	if len(fs) == 0 {
		return variant, nil
	}
	slices.SortStableFunc(fs, func(a, b task.FieldError) int { return cmp.Compare(a.Field, b.Field) })
	return nil, httpapi.Problem(http.StatusBadRequest, httpapi.TypeInvalid, fmt.Sprintf("%d invalid field(s); first %s: %s", len(fs), fs[0].Field, fs[0].Detail), fs...)
}

// idempotencyKey returns the request's Idempotency-Key, checked; "" when it names none.
func idempotencyKey(r *http.Request) (string, error) {
	key := r.Header.Get(task.HeaderIdempotencyKey)
	if key == "" {
		return "", nil
	}
	return key, checkIdempotencyKey(key)
}

// decodeBody reads the request's body, within the size limit, into dst: unknown fields and
// trailing data are refused (decodeStrict).
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, dst any) error {
	data, err := readBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	return decodeStrict(data, dst)
}

// checkIdempotencyKey refuses keys that are empty, too long or not printable ASCII.
func checkIdempotencyKey(key string) error {
	if len(key) > maxIdempotencyKey {
		return fieldProblem(task.HeaderIdempotencyKey, "must be at most %d characters", maxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return fieldProblem(task.HeaderIdempotencyKey, "must be printable ASCII without spaces")
		}
	}
	return nil
}
