package prompts_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// ticketSchema uses the JSON Schema vocabulary Gemini's structured output accepts beyond the
// built-in families: $defs/$ref, anyOf, a type array for null, format, prefixItems, integer
// bounds, and Gemini's own propertyOrdering; and pattern, which Gemini does not take but genbox
// checks.
const ticketSchema = `
type: object
propertyOrdering: [kind, due, tags, owner, detail, effort, span, key]
$defs:
  person:
    type: object
    properties:
      name: {type: string}
      email: {type: string, format: email}
    required: [name]
    additionalProperties: false
properties:
  kind: {type: string, enum: [bug, question]}
  due: {type: string, format: date}
  tags: {type: array, items: {type: string}, minItems: 1, maxItems: 3}
  owner:
    anyOf:
      - $ref: "#/$defs/person"
      - type: "null"
  detail: {type: [string, "null"]}
  effort: {type: integer, minimum: 1, maximum: 13}
  span:
    type: array
    prefixItems: [{type: string, format: date-time}, {type: string, format: date-time}]
    items: false
  key: {type: string, pattern: '^[A-Z]+-[0-9]+$'}
required: [kind, due, tags, owner]
additionalProperties: false
`

func ticketFamily(schema string) string {
	return "family: ticket\nversion: '1'\ntemplate: '{{.Input}}'\nresponse_mime_type: application/json\n" +
		"response_schema:" + strings.ReplaceAll("\n"+strings.TrimSpace(schema), "\n", "\n  ") + "\nvariants: {default: {}}\n"
}

func ticket(t *testing.T) *prompts.Variant {
	t.Helper()
	vs, err := prompts.Parse([]byte(ticketFamily(ticketSchema)))
	if err != nil {
		t.Fatalf("parse a family using Gemini's schema vocabulary: %v", err)
	}
	return vs[prompts.DefaultVariant]
}

func TestSchemaVocabulary(t *testing.T) {
	t.Parallel()
	v := ticket(t)
	const ok = `"kind":"bug","due":"2026-12-07","tags":["billing"]`
	const mismatch = "' does not match pattern '^[A-Z]+-[0-9]+$'"
	for _, tc := range []struct {
		name, out string
		want      string // the error after "ticket/default: prompts: invalid output: "; "" accepts
	}{
		{"owner by $ref", `{` + ok + `,"owner":{"name":"Ada","email":"ada@example.com"}}`, ""},
		{"null owner through anyOf", `{` + ok + `,"owner":null,"detail":null,"effort":13}`, ""},
		{"span by prefixItems", `{` + ok + `,"owner":null,"span":["2026-12-07T08:00:00Z","2026-12-07T09:30:00Z"]}`, ""},
		{"enum", `{"kind":"feature","due":"2026-12-07","tags":["x"],"owner":null}`,
			"$.kind: value must be one of 'bug', 'question'"},
		{"format date", `{"kind":"bug","due":"tomorrow","tags":["x"],"owner":null}`,
			`$.due: 'tomorrow' is not valid date: parsing time "tomorrow" as "2006-01-02": cannot parse "tomorrow" as "2006"`},
		{"minItems", `{"kind":"bug","due":"2026-12-07","tags":[],"owner":null}`,
			"$.tags: minItems: got 0, want 1"},
		{"maxItems", `{"kind":"bug","due":"2026-12-07","tags":["a","b","c","d"],"owner":null}`,
			"$.tags: maxItems: got 4, want 3"},
		{"type array", `{` + ok + `,"owner":null,"detail":5}`,
			"$.detail: got number, want null or string"},
		{"integer", `{` + ok + `,"owner":null,"effort":2.5}`,
			"$.effort: got number, want integer"},
		{"maximum", `{` + ok + `,"owner":null,"effort":21}`,
			"$.effort: maximum: got 21, want 13"},
		{"anyOf says why each branch failed", `{` + ok + `,"owner":{"email":"ada@example.com"}}`,
			"$.owner: got object, want null; $.owner: missing property 'name'"},
		{"format inside $ref", `{` + ok + `,"owner":{"name":"Ada","email":"ada"}}`,
			"$.owner.email: 'ada' is not valid email: missing @; $.owner: got object, want null"},
		{"prefixItems", `{` + ok + `,"owner":null,"span":["2026-12-07T08:00:00Z",3]}`,
			"$.span[1]: got number, want string"},
		{"no items past prefixItems", `{` + ok + `,"owner":null,"span":["2026-12-07T08:00:00Z","2026-12-07T09:00:00Z","x"]}`,
			"$.span[2]: false schema"},
		{"pattern", `{` + ok + `,"owner":null,"key":"OPS-12"}`, ""},
		{"a long value is cut in the middle", `{` + ok + `,"owner":null,"key":"` + strings.Repeat("x", 5000) + `"}`,
			"$.key: '" + strings.Repeat("x", 112) + "…" + strings.Repeat("x", 80-len(mismatch)) + mismatch},
		{"additionalProperties", `{` + ok + `,"owner":null,"colour":"red"}`,
			"$: additional properties 'colour' not allowed"},
		{"at most three failures", `{"kind":1,"due":2,"tags":3,"owner":4,"effort":"x"}`,
			"$.due: got number, want string; $.effort: got string, want integer; $.kind: got number, want string; and 3 more"},
	} {
		err := v.Validate(tc.out)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: Validate(%s) = %v, want nil", tc.name, tc.out, err)
			}
			continue
		}
		if !errors.Is(err, prompts.ErrInvalidOutput) {
			t.Errorf("%s: Validate(%s) = %v, want ErrInvalidOutput", tc.name, tc.out, err)
			continue
		}
		if diff := cmp.Diff("ticket/default: prompts: invalid output: "+tc.want, err.Error()); diff != "" {
			t.Errorf("%s: the error a quality failure shows (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestSchemaRejectedAtLoad(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, schema, want string
	}{
		{"a typo", "type: object\nproperties: {a: {type: string, requried: true}}",
			"$.properties.a: additional properties 'requried' not allowed"},
		{"OpenAPI's nullable (JSON Schema says type: [string, 'null'])", "type: object\nproperties: {a: {type: string, nullable: true}}",
			"$.properties.a: additional properties 'nullable' not allowed"},
		{"a type", "type: objekt",
			"$.type: got string, want array; $.type: value must be one of 'array', 'boolean', 'integer', 'null', 'number', 'object', 'string'"},
		{"a keyword's value", "type: array\nminItems: -1",
			"$.minItems: minimum: got -1, want 0"},
		{"a keyword beside $ref, which Gemini refuses", "$defs: {s: {type: string}}\nproperties: {a: {$ref: '#/$defs/s', description: d}}",
			"$.properties.a: additional properties 'description' not allowed"},
		{"another draft", "$schema: 'http://json-schema.org/draft-07/schema#'\ntype: object",
			"$.$schema: value must be 'https://json-schema.org/draft/2020-12/schema'"},
		{"a reference out of the schema", "type: object\nproperties: {a: {$ref: 'other.json#/a'}}",
			"$ref other.json: only references within the schema (#/$defs/...) are followed"},
		{"a file", "$ref: 'file:///etc/passwd'",
			"$ref file:///etc/passwd: only references within the schema (#/$defs/...) are followed"},
		{"a missing definition", "type: object\nproperties: {a: {$ref: '#/$defs/gone'}}",
			"$ref #/$defs/gone: not found in the schema"},
		{"a missing anchor", "type: object\nproperties: {a: {$ref: '#person'}}",
			"$ref #person: not found in the schema"},
		{"a bad pattern", "type: string\npattern: '('",
			"$.pattern: '(' is not valid regex: error parsing regexp: missing closing ): `(`"},
		{"not an object", "true",
			"want an object, got bool"},
	} {
		_, err := prompts.Parse([]byte(ticketFamily(tc.schema)))
		if err == nil {
			t.Errorf("%s: loaded", tc.name)
			continue
		}
		if diff := cmp.Diff("ticket: response_schema: "+tc.want, err.Error()); diff != "" {
			t.Errorf("%s: the load error (-want +got):\n%s", tc.name, diff)
		}
	}
	variant := strings.Replace(ticketFamily(ticketSchema), "variants: {default: {}}",
		"variants: {default: {}, strict: {response_schema: {type: object, requried: [a]}}}", 1)
	_, err := prompts.Parse([]byte(variant))
	want := "ticket/strict: response_schema: $: additional properties 'requried' not allowed"
	if err == nil || err.Error() != want {
		t.Errorf("a variant's schema: %v, want %s", err, want)
	}
}

// FuzzValidate sends model outputs through a family using the whole vocabulary: whatever the
// output, Validate answers without panicking, and accepts only JSON.
func FuzzValidate(f *testing.F) {
	for _, out := range []string{
		`{"kind":"bug","due":"2026-12-07","tags":["x"],"owner":{"name":"Ada"},"span":["2026-12-07T08:00:00Z",1,2]}`,
		`{"kind":1,"due":2,"tags":3,"owner":4,"effort":"x"}`,
		`[{"a":[[[]]]}]`, `null`, `"s"`, `1e400`, `{"tags":["a","a"]} x`,
	} {
		f.Add(out)
	}
	vs, err := prompts.Parse([]byte(ticketFamily(ticketSchema)))
	if err != nil {
		f.Fatal(err)
	}
	v := vs[prompts.DefaultVariant]
	f.Fuzz(func(t *testing.T, out string) {
		if err := v.Validate(out); err == nil && !json.Valid([]byte(out)) {
			t.Fatalf("Validate(%q) accepted what is not JSON", out)
		}
	})
}

// TestSchemaThroughGemini renders a family whose schema uses the vocabulary the fake Gemini
// samples from (anyOf, $ref, a type array, format, array bounds, propertyOrdering), sends it as
// the worker does, and checks that the answer passed the family's validator (Generate validates
// it) and that the model received the schema as written: Gemini's responseJsonSchema takes JSON
// Schema with type arrays, $defs/$ref and propertyOrdering, where its OpenAPI-style
// responseSchema would want nullable, upper-case types and no $ref.
func TestSchemaThroughGemini(t *testing.T) {
	t.Parallel()
	const schema = `
type: object
propertyOrdering: [due, tags, owner]
$defs:
  person: {type: object, properties: {name: {type: string}, email: {type: string, format: email}}, required: [name, email]}
properties:
  due: {type: string, format: date-time}
  tags: {type: array, items: {type: string, enum: [billing, outage]}, minItems: 2, maxItems: 3}
  owner: {anyOf: [{$ref: "#/$defs/person"}, {type: "null"}]}
  note: {type: [string, "null"]}
required: [due, tags, owner, note]
additionalProperties: false
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ticket.yaml"), []byte(ticketFamily(schema)), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := prompts.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := reg.Render("ticket", "", "The site is down and I was billed.", nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sent []any
	srv := geminitest.NewServer(geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		mu.Lock()
		sent = append(sent, r.ResponseSchema)
		mu.Unlock()
		return geminitest.DefaultReply(r)
	}))
	t.Cleanup(srv.Close)
	cfg := gemini.DefaultConfig()
	cfg.BaseURL, cfg.Models = srv.URL, []string{"model-a"}
	if cfg.Prices, err = gemini.ParsePrices("model-a=1/2"); err != nil {
		t.Fatal(err)
	}
	client, err := gemini.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Generate(t.Context(), gemini.NewRequest("t-1", "tenant", rd))
	if err != nil {
		t.Fatalf("Generate: %v (a quality error: the fake's answer failed the family's schema)", err)
	}
	if res.Calls != 1 {
		t.Errorf("%d calls, want 1: the first answer fits the schema", res.Calls)
	}
	written, err := yaml.YAMLToJSON([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	var want any
	if err := json.Unmarshal(written, &want); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]any{want}, sent); diff != "" {
		t.Errorf("the schema the model received (-written +received):\n%s", diff)
	}
}
