package geminitest_test

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/genai"
)

// answer is what both schemas below describe.
type answer struct {
	Title  string   `json:"title"`
	Mood   string   `json:"mood"`
	Score  int      `json:"score"`
	Ratio  float64  `json:"ratio"`
	Tags   []string `json:"tags"`
	Done   bool     `json:"done"`
	Author struct {
		Name  string `json:"name"`
		Email string `json:"email"`
	} `json:"author"`
}

func (a answer) check(t *testing.T) {
	t.Helper()
	if a.Title == "" || len(a.Title) > 40 {
		t.Errorf("title %q, want 1..40 bytes", a.Title)
	}
	if a.Mood != "calm" {
		t.Errorf("mood %q, want the first enum value", a.Mood)
	}
	if a.Score < 3 || a.Score > 7 {
		t.Errorf("score %d, want in [3, 7]", a.Score)
	}
	if a.Ratio < 0.25 || a.Ratio > 0.5 {
		t.Errorf("ratio %v, want in [0.25, 0.5]", a.Ratio)
	}
	if len(a.Tags) < 2 || len(a.Tags) > 4 {
		t.Errorf("tags %q, want 2..4 items", a.Tags)
	}
	if a.Author.Name == "" || !strings.Contains(a.Author.Email, "@") {
		t.Errorf("author %+v, want a name and an email", a.Author)
	}
}

func ptr[T any](v T) *T { return &v }

func TestJSONOutputSatisfiesSchema(t *testing.T) {
	t.Parallel()
	jsonSchema := map[string]any{
		"type": "object",
		"$defs": map[string]any{
			"person": map[string]any{
				"type":       "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}, "email": map[string]any{"type": "string", "format": "email"}},
				"required":   []string{"name", "email"},
			},
		},
		"properties": map[string]any{
			"title":  map[string]any{"type": "string", "minLength": 1, "maxLength": 40},
			"mood":   map[string]any{"type": "string", "enum": []string{"calm", "angry"}},
			"score":  map[string]any{"type": "integer", "minimum": 3, "maximum": 7},
			"ratio":  map[string]any{"type": "number", "minimum": 0.25, "maximum": 0.5},
			"tags":   map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "minItems": 2, "maxItems": 4},
			"done":   map[string]any{"type": []string{"boolean", "null"}},
			"author": map[string]any{"$ref": "#/$defs/person"},
		},
		"required": []string{"title", "mood", "score", "ratio", "tags", "done", "author"},
	}
	str := &genai.Schema{Type: genai.TypeString}
	openAPISchema := &genai.Schema{
		Type: genai.TypeObject,
		Properties: map[string]*genai.Schema{
			"title": {Type: genai.TypeString, MinLength: ptr[int64](1), MaxLength: ptr[int64](40)},
			"mood":  {Type: genai.TypeString, Enum: []string{"calm", "angry"}},
			"score": {Type: genai.TypeInteger, Minimum: ptr(3.0), Maximum: ptr(7.0)},
			"ratio": {Type: genai.TypeNumber, Minimum: ptr(0.25), Maximum: ptr(0.5)},
			"tags":  {Type: genai.TypeArray, Items: str, MinItems: ptr[int64](2), MaxItems: ptr[int64](4)},
			"done":  {Type: genai.TypeBoolean},
			"author": {Type: genai.TypeObject, Properties: map[string]*genai.Schema{"name": str, "email": {Type: genai.TypeString, Format: "email"}},
				Required: []string{"name", "email"}},
		},
		Required: []string{"title", "mood", "score", "ratio", "tags", "done", "author"},
	}
	tests := []struct {
		name string
		cfg  *genai.GenerateContentConfig
	}{
		{"responseJsonSchema", &genai.GenerateContentConfig{ResponseMIMEType: "application/json", ResponseJsonSchema: jsonSchema}},
		{"responseSchema", &genai.GenerateContentConfig{ResponseMIMEType: "application/json", ResponseSchema: openAPISchema}},
	}
	b := setup(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := b.generate(t.Context(), model, "fill the form for task j-1", tt.cfg)
			if err != nil {
				t.Fatalf("GenerateContent: %v", err)
			}
			dec := json.NewDecoder(strings.NewReader(r.Text()))
			dec.DisallowUnknownFields()
			var a answer
			if err := dec.Decode(&a); err != nil {
				t.Fatalf("answer %q: %v", r.Text(), err)
			}
			var raw map[string]any
			if err := json.Unmarshal([]byte(r.Text()), &raw); err != nil || len(raw) != 7 {
				t.Fatalf("answer %q has %d properties (%v), want all 7 required", r.Text(), len(raw), err)
			}
			a.check(t)
		})
	}
}

func TestJSONWithoutSchemaAndEnum(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := b.generate(t.Context(), model, "anything", &genai.GenerateContentConfig{ResponseMIMEType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid([]byte(r.Text())) {
		t.Errorf("schemaless JSON answer %q is not JSON", r.Text())
	}
	r, err = b.generate(t.Context(), model, "pick", &genai.GenerateContentConfig{ResponseMIMEType: "text/x.enum",
		ResponseSchema: &genai.Schema{Type: genai.TypeString, Enum: []string{"yes", "no"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Text() != "yes" {
		t.Errorf("enum answer %q, want the first value", r.Text())
	}
}

func TestMaxOutputTokensTruncates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := b.generate(t.Context(), model, "long", &genai.GenerateContentConfig{MaxOutputTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.Candidates[0].FinishReason != genai.FinishReasonMaxTokens || r.UsageMetadata.CandidatesTokenCount > 2 {
		t.Errorf("finishReason %q with %d output tokens, want MAX_TOKENS within 2", r.Candidates[0].FinishReason, r.UsageMetadata.CandidatesTokenCount)
	}
}
