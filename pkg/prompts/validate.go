package prompts

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// maxSchemaDepth bounds nesting in response schemas, so a hostile family file cannot recurse forever.
const maxSchemaDepth = 16

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
	var doc any
	dec := json.NewDecoder(strings.NewReader(output))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if dec.More() {
		return errors.New("not JSON: trailing data")
	}
	if v.ResponseSchema == nil {
		return nil
	}
	return match(v.ResponseSchema, doc, "$")
}

// The JSON Schema subset genbox families use: type, enum, properties, required,
// additionalProperties (false), items, minItems/maxItems, minLength/maxLength, minimum/maximum.
var schemaKeys = map[string]bool{
	"type": true, "enum": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "minItems": true, "maxItems": true, "minLength": true, "maxLength": true,
	"minimum": true, "maximum": true, "description": true, "title": true,
}

var schemaTypes = map[string]bool{"object": true, "array": true, "string": true, "number": true, "integer": true, "boolean": true, "null": true}

// checkSchema rejects schemas outside the subset, so a family file fails at load, not per output.
func checkSchema(s any, depth int) error {
	if s == nil {
		return nil
	}
	if depth > maxSchemaDepth {
		return errors.New("nested too deep")
	}
	m, ok := s.(map[string]any)
	if !ok {
		return fmt.Errorf("want an object, got %T", s)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !schemaKeys[k] {
			return fmt.Errorf("keyword %q is not supported", k)
		}
	}
	if t, ok := m["type"]; ok {
		ts, ok := t.(string)
		if !ok || !schemaTypes[ts] {
			return fmt.Errorf("type %v: want one of object, array, string, number, integer, boolean, null", t)
		}
	}
	if e, ok := m["enum"]; ok {
		if l, ok := e.([]any); !ok || len(l) == 0 {
			return errors.New("enum: want a non-empty list")
		}
	}
	if r, ok := m["required"]; ok {
		l, ok := r.([]any)
		if !ok {
			return errors.New("required: want a list of names")
		}
		for _, n := range l {
			if _, ok := n.(string); !ok {
				return errors.New("required: want a list of names")
			}
		}
	}
	if a, ok := m["additionalProperties"]; ok {
		if _, ok := a.(bool); !ok {
			return errors.New("additionalProperties: only true or false is supported")
		}
	}
	for _, k := range []string{"minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum"} {
		if x, ok := m[k]; ok {
			if _, ok := x.(float64); !ok {
				return fmt.Errorf("%s: want a number", k)
			}
		}
	}
	if p, ok := m["properties"]; ok {
		props, ok := p.(map[string]any)
		if !ok {
			return errors.New("properties: want an object")
		}
		for _, name := range slices.Sorted(maps.Keys(props)) {
			if err := checkSchema(props[name], depth+1); err != nil {
				return fmt.Errorf("properties.%s: %w", name, err)
			}
		}
	}
	if it, ok := m["items"]; ok {
		if err := checkSchema(it, depth+1); err != nil {
			return fmt.Errorf("items: %w", err)
		}
	}
	return nil
}

// match checks a decoded JSON value (numbers as json.Number) against a checked schema.
func match(s any, v any, path string) error {
	m, _ := s.(map[string]any)
	if m == nil {
		return nil
	}
	if t, ok := m["type"].(string); ok && !isType(v, t) {
		return fmt.Errorf("%s: want %s, got %s", path, t, typeName(v))
	}
	if e, ok := m["enum"].([]any); ok && !slices.ContainsFunc(e, func(x any) bool { return equal(x, v) }) {
		return fmt.Errorf("%s: %v is not one of %v", path, v, e)
	}
	switch x := v.(type) {
	case json.Number:
		f, _ := x.Float64()
		if lo, ok := m["minimum"].(float64); ok && f < lo {
			return fmt.Errorf("%s: %v is below the minimum %v", path, f, lo)
		}
		if hi, ok := m["maximum"].(float64); ok && f > hi {
			return fmt.Errorf("%s: %v is above the maximum %v", path, f, hi)
		}
	case string:
		n := float64(utf8.RuneCountInString(x))
		if lo, ok := m["minLength"].(float64); ok && n < lo {
			return fmt.Errorf("%s: shorter than %v characters", path, lo)
		}
		if hi, ok := m["maxLength"].(float64); ok && n > hi {
			return fmt.Errorf("%s: longer than %v characters", path, hi)
		}
	case []any:
		n := float64(len(x))
		if lo, ok := m["minItems"].(float64); ok && n < lo {
			return fmt.Errorf("%s: fewer than %v items", path, lo)
		}
		if hi, ok := m["maxItems"].(float64); ok && n > hi {
			return fmt.Errorf("%s: more than %v items", path, hi)
		}
		for i, item := range x {
			if err := match(m["items"], item, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case map[string]any:
		props, _ := m["properties"].(map[string]any)
		req, _ := m["required"].([]any)
		for _, r := range req {
			if _, ok := x[r.(string)]; !ok {
				return fmt.Errorf("%s: missing %q", path, r)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			ps, known := props[k]
			if !known {
				if closed, _ := m["additionalProperties"].(bool); m["additionalProperties"] != nil && !closed {
					return fmt.Errorf("%s: unexpected property %q", path, k)
				}
				continue
			}
			if err := match(ps, x[k], path+"."+k); err != nil {
				return err
			}
		}
	}
	return nil
}

func isType(v any, t string) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		_, err := n.Int64()
		return err == nil
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	}
	return false
}

func typeName(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// equal compares a schema enum value (decoded from the family file) with an output value.
func equal(enum, v any) bool {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		e, isNum := enum.(float64)
		return err == nil && isNum && e == f
	case string, bool, nil:
		return enum == v
	}
	return false // objects and arrays are never enum members here
}
