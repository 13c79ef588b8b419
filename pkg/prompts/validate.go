package prompts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Validate checks an output against the variant: JSON matching the response schema for a JSON
// variant, and the text checks. Its errors wrap ErrInvalidOutput and name the family/variant.
func (v *Variant) Validate(output string) error {
	if err := v.validate(output); err != nil {
		return fmt.Errorf("%s/%s: %w: %w", v.Family, v.Name, ErrInvalidOutput, err)
	}
	return nil
}

func (v *Variant) validate(output string) error {
	n := utf8.RuneCountInString(strings.TrimSpace(output))
	switch {
	case n < max(v.Checks.MinChars, 1):
		return fmt.Errorf("%d characters, want at least %d", n, max(v.Checks.MinChars, 1))
	case v.Checks.MaxChars > 0 && n > v.Checks.MaxChars:
		return fmt.Errorf("%d characters, want at most %d", n, v.Checks.MaxChars)
	}
	if p := v.Checks.Prefix; p != "" {
		for i, line := range strings.Split(strings.TrimSpace(output), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, strings.TrimSpace(p)) {
				return fmt.Errorf("line %d does not start with %q", i+1, p)
			}
		}
	}
	if v.ResponseMIMEType != MIMEJSON {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(output))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if v.schema == nil {
		return nil
	}
	if err := v.schema.Validate(doc); err != nil {
		return errors.New(describe(err, doc))
	}
	return nil
}

// schemaURL names a family's response schema while it compiles; every other URL a $ref
// resolves to is refused (noLoader).
const schemaURL = "mem:///response_schema"

// metaURL names metaSchema.
const metaURL = "urn:genbox:response_schema_meta"

// metaSchema is what a response schema may say: JSON Schema 2020-12 (the draft Gemini's
// responseJsonSchema takes) with no keyword outside it but Gemini's propertyOrdering, so that a
// typo or OpenAPI's nullable fails at load instead of constraining nothing; and, as Gemini asks,
// nothing but $-keywords beside a $ref. Its $dynamicAnchor makes every subschema answer to it.
const metaSchema = `{
	"$schema": "https://json-schema.org/draft/2020-12/schema",
	"$dynamicAnchor": "meta",
	"allOf": [{"$ref": "https://json-schema.org/draft/2020-12/schema"}],
	"properties": {
		"$schema": {"const": "https://json-schema.org/draft/2020-12/schema"},
		"propertyOrdering": {"type": "array", "items": {"type": "string"}},
		"$id": true, "$ref": true, "$anchor": true, "$dynamicRef": true, "$dynamicAnchor": true,
		"$comment": true, "$defs": true,
		"prefixItems": true, "items": true, "contains": true, "additionalProperties": true,
		"properties": true, "patternProperties": true, "dependentSchemas": true, "propertyNames": true,
		"if": true, "then": true, "else": true, "allOf": true, "anyOf": true, "oneOf": true, "not": true,
		"unevaluatedItems": true, "unevaluatedProperties": true,
		"type": true, "const": true, "enum": true, "multipleOf": true, "maximum": true,
		"exclusiveMaximum": true, "minimum": true, "exclusiveMinimum": true, "maxLength": true,
		"minLength": true, "pattern": true, "maxItems": true, "minItems": true, "uniqueItems": true,
		"maxContains": true, "minContains": true, "maxProperties": true, "minProperties": true,
		"required": true, "dependentRequired": true,
		"title": true, "description": true, "default": true, "deprecated": true, "readOnly": true,
		"writeOnly": true, "examples": true, "format": true,
		"contentEncoding": true, "contentMediaType": true, "contentSchema": true
	},
	"additionalProperties": false,
	"dependentSchemas": {"$ref": {"patternProperties": {"^\\$": true}, "additionalProperties": false}}
}`

var meta = sync.OnceValue(func() *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(metaSchema))
	if err != nil {
		panic(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat() // a pattern must compile
	if err := c.AddResource(metaURL, doc); err != nil {
		panic(err)
	}
	return c.MustCompile(metaURL)
})

// noLoader follows no reference out of a schema: a family file cannot make a service read a
// file or call a URL, and the model is sent the schema alone.
type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errOutside }

var errOutside = errors.New("only references within the schema (#/$defs/...) are followed")

// compileSchema checks a response schema as decoded from a family file and compiles it, with
// format assertions on (Gemini constrains "date-time", "date" and "time" strings too). A nil
// schema compiles to nil.
func compileSchema(s any) (*jsonschema.Schema, error) {
	if s == nil {
		return nil, nil
	}
	if _, ok := s.(map[string]any); !ok {
		return nil, fmt.Errorf("want an object, got %T", s)
	}
	// Decoded again from JSON, so that numbers are json.Number, as the compiler wants them.
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	if err := meta().Validate(doc); err != nil {
		return nil, errors.New(describe(err, doc))
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, compileError(err)
	}
	return sch, nil
}

// compileError says what is wrong with a schema that passed metaSchema: a reference.
func compileError(err error) error {
	var load *jsonschema.LoadURLError
	var missing *jsonschema.JSONPointerNotFoundError
	var anchor *jsonschema.AnchorNotFoundError
	switch {
	case errors.As(err, &load):
		return fmt.Errorf("$ref %s: %w", strings.TrimPrefix(load.URL, "mem:///"), load.Err)
	case errors.As(err, &missing):
		return fmt.Errorf("$ref %s: not found in the schema", strings.TrimPrefix(missing.URL, schemaURL))
	case errors.As(err, &anchor):
		return fmt.Errorf("$ref %s: not found in the schema", strings.TrimPrefix(anchor.Reference, schemaURL))
	}
	return err
}

// maxFailures bounds the failures an error lists: a quality failure is kept with the task, in
// a bounded text.
const maxFailures = 3

var printer = message.NewPrinter(language.English)

// describe lists what failed in a validation of doc, one "path: why" per failed keyword, sorted,
// at most maxFailures of them. A path is JSONPath over doc: $.entities[0].type.
func describe(err error, doc any) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var out []string
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			out = append(out, clip(jsonPath(doc, e.InstanceLocation)+": "+e.ErrorKind.LocalizedString(printer)))
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	slices.Sort(out)
	out = slices.Compact(out)
	if n := len(out) - maxFailures; n > 0 {
		out = append(out[:maxFailures], fmt.Sprintf("and %d more", n))
	}
	return strings.Join(out, "; ")
}

// clip cuts the middle out of a long failure, where a long value is quoted, and keeps the path
// before it and the reason after it: a model's output can be megabytes, its error goes to logs.
func clip(s string) string {
	const head, tail = 120, 80
	if len(s) <= head+tail {
		return s
	}
	i, j := head, len(s)-tail
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	for j < len(s) && !utf8.RuneStart(s[j]) {
		j++
	}
	return s[:i] + "…" + s[j:]
}

// jsonPath spells a location in doc (JSON Pointer tokens) as $.name[index].
func jsonPath(doc any, loc []string) string {
	var b strings.Builder
	b.WriteString("$")
	for _, tok := range loc {
		if a, ok := doc.([]any); ok {
			b.WriteString("[" + tok + "]")
			if i, err := strconv.Atoi(tok); err == nil && i < len(a) {
				doc = a[i]
			}
			continue
		}
		b.WriteString("." + tok)
		if m, ok := doc.(map[string]any); ok {
			doc = m[tok]
		}
	}
	return b.String()
}
