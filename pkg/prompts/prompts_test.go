package prompts_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

func registry(t *testing.T) *prompts.Registry {
	t.Helper()
	r, err := prompts.Default()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func ptr[T any](v T) *T { return &v }

func TestDefaultFamilies(t *testing.T) {
	t.Parallel()
	r := registry(t)
	if got := strings.Join(r.Families(), ","); got != "analyze,classify,describe,extract,summarize,transcribe" {
		t.Fatalf("families %s", got)
	}
	for _, tc := range []struct {
		family, variant string
		want            bool
	}{
		{"summarize", "", true},
		{"summarize", "default", true},
		{"summarize", "digest", true},
		{"classify", "sentiment", true},
		{"analyze", "entities", true},
		{"summarize", "nope", false},
		{"nope", "", false},
	} {
		if got := r.Has(tc.family, tc.variant); got != tc.want {
			t.Errorf("Has(%q, %q) = %v, want %v", tc.family, tc.variant, got, tc.want)
		}
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	r := registry(t)
	got, err := r.Render("summarize", "digest", "The quarterly report.", &task.GenConfig{MaxOutputTokens: ptr(int32(100))})
	if err != nil {
		t.Fatal(err)
	}
	if got.Family != "summarize" || got.Variant != "digest" || got.Version == "" {
		t.Errorf("identity %s/%s@%s", got.Family, got.Variant, got.Version)
	}
	if !strings.Contains(got.Prompt, "The quarterly report.") || got.SystemInstruction == "" {
		t.Errorf("prompt %q system %q", got.Prompt, got.SystemInstruction)
	}
	if *got.Config.Temperature != 0.2 || *got.Config.MaxOutputTokens != 100 {
		t.Errorf("config %+v: want the variant's temperature and the override's max_output_tokens", got.Config)
	}
	if got.OnExhausted != prompts.OnExhaustedStale || !got.CacheAllowed {
		t.Errorf("digest: on_exhausted %q cache_allowed %v", got.OnExhausted, got.CacheAllowed)
	}
	def, err := r.Render("summarize", "", "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if def.OnExhausted != prompts.OnExhaustedPark || def.Variant != "default" {
		t.Errorf("default: %+v", def)
	}
}

func TestRenderRejects(t *testing.T) {
	t.Parallel()
	r := registry(t)
	for _, tc := range []struct {
		name    string
		family  string
		variant string
		cfg     *task.GenConfig
		want    error
	}{
		{"unknown family", "nope", "", nil, prompts.ErrUnknown},
		{"unknown variant", "classify", "nope", nil, prompts.ErrUnknown},
		{"hot", "classify", "", &task.GenConfig{Temperature: ptr(2.5)}, prompts.ErrInvalidConfig},
		{"long", "classify", "", &task.GenConfig{MaxOutputTokens: ptr(int32(100000))}, prompts.ErrInvalidConfig},
		{"top_p", "analyze", "", &task.GenConfig{TopP: ptr(0.0)}, prompts.ErrInvalidConfig},
	} {
		_, err := r.Render(tc.family, tc.variant, "x", tc.cfg)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && errors.Is(tc.want, prompts.ErrInvalidConfig) && !strings.Contains(err.Error(), tc.family+"/default") {
			t.Errorf("%s: %v does not name the family/variant", tc.name, err)
		}
	}
}

func TestClassifyValidator(t *testing.T) {
	t.Parallel()
	r := registry(t)
	rd, err := r.Render("classify", "", "My card was charged twice", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rd.ResponseMIMEType != prompts.MIMEJSON || rd.ResponseJSONSchema == nil {
		t.Fatalf("classify asks for %q with schema %v", rd.ResponseMIMEType, rd.ResponseJSONSchema)
	}
	for _, tc := range []struct {
		out string
		ok  bool
	}{
		{`{"category":"billing","confidence":0.93}`, true},
		{`{"category":"other","confidence":0}`, true},
		{`{"category":"other","confidence":1}`, true},
		{`{"category":"weather","confidence":0.5}`, false},
		{`{"category":"billing","confidence":1.5}`, false},
		{`{"category":"billing","confidence":-0.1}`, false},
		{`{"category":"billing","confidence":"high"}`, false},
		{`{"category":"billing"}`, false},
		{`{"category":"billing","confidence":0.5,"extra":1}`, false},
		{`{"category":"billing","confidence":0.5} trailing`, false},
		{`billing`, false},
		{``, false},
		{`[]`, false},
	} {
		err := rd.Validate(tc.out)
		if (err == nil) != tc.ok {
			t.Errorf("Validate(%q) = %v, want ok=%v", tc.out, err, tc.ok)
		}
		if err != nil && (!errors.Is(err, prompts.ErrInvalidOutput) || !strings.HasPrefix(err.Error(), "classify/default:")) {
			t.Errorf("Validate(%q) error %q: want ErrInvalidOutput naming classify/default", tc.out, err)
		}
	}
	// docs/architecture.md quotes this error.
	const want = "classify/default: prompts: invalid output: $.confidence: maximum: got 1.5, want 1"
	if err := rd.Validate(`{"category":"billing","confidence":1.5}`); err == nil || err.Error() != want {
		t.Errorf("an out-of-range confidence: %v, want %s", err, want)
	}
}

func TestTextValidators(t *testing.T) {
	t.Parallel()
	r := registry(t)
	digest, _ := r.Render("summarize", "digest", "x", nil)
	if err := digest.Validate("- one\n- two\n"); err != nil {
		t.Errorf("bullets rejected: %v", err)
	}
	if err := digest.Validate("one\n- two"); err == nil || !strings.Contains(err.Error(), "summarize/digest") {
		t.Errorf("non-bullet line: %v", err)
	}
	def, _ := r.Render("summarize", "", "x", nil)
	if err := def.Validate("   "); err == nil {
		t.Error("empty summary accepted")
	}
	analyze, _ := r.Render("analyze", "entities", "x", nil)
	if err := analyze.Validate(`{"entities":[{"name":"Acme","type":"organization"}]}`); err != nil {
		t.Errorf("entities: %v", err)
	}
	if err := analyze.Validate(`{"entities":[{"name":"Acme","type":"planet"}]}`); err == nil {
		t.Error("unknown entity type accepted")
	}
}

func TestLowerTemperature(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   *float64
		want float64
	}{{ptr(0.8), 0.4}, {ptr(0.2), 0.1}, {ptr(0.0), 0}, {nil, 0.5}} {
		got := prompts.LowerTemperature(task.GenConfig{Temperature: tc.in})
		if *got.Temperature != tc.want {
			t.Errorf("LowerTemperature(%v) = %v, want %v", tc.in, *got.Temperature, tc.want)
		}
	}
}

func TestLoadDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("translate.yaml", `
family: translate
version: "1"
models: [gemini-2.5-pro]
config: {temperature: 0.1}
template: "Translate to French: {{.Input}}"
variants:
  default: {}
  formal:
    version: "2"
    template: "Translate to formal French: {{.Input}}"
`)
	write("notes.txt", "ignored")
	r, err := prompts.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Has("summarize", "") || !r.Has("translate", "formal") {
		t.Fatalf("families %v", r.Families())
	}
	rd, err := r.Render("translate", "formal", "bonjour", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rd.Version != "2" || rd.Models[0] != "gemini-2.5-pro" || rd.CacheAllowed || rd.Prompt != "Translate to formal French: bonjour" {
		t.Errorf("rendered %+v", rd)
	}

	for name, body := range map[string]string{
		"no default variant":  "family: x\nversion: '1'\ntemplate: t\nvariants: {other: {}}\n",
		"bad template":        "family: x\nversion: '1'\ntemplate: '{{.Input'\nvariants: {default: {}}\n",
		"bad on_exhausted":    "family: x\nversion: '1'\ntemplate: t\non_exhausted: retry\nvariants: {default: {}}\n",
		"unknown field":       "family: x\nversion: '1'\ntemplate: t\ncolour: red\nvariants: {default: {}}\n",
		"schema without json": "family: x\nversion: '1'\ntemplate: t\nresponse_schema: {type: object}\nvariants: {default: {}}\n",
		"bad schema keyword":  "family: x\nversion: '1'\ntemplate: t\nresponse_mime_type: application/json\nresponse_schema: {type: object, nullable: true}\nvariants: {default: {}}\n",
		"no version":          "family: x\ntemplate: t\nvariants: {default: {}}\n",
		"bad name":            "family: X Y\nversion: '1'\ntemplate: t\nvariants: {default: {}}\n",
	} {
		bad := t.TempDir()
		if err := os.WriteFile(filepath.Join(bad, "x.yaml"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := prompts.Load(bad); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"summarize.yaml", "classify.yaml", "analyze.yaml"} {
		b, err := os.ReadFile(filepath.Join("families", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(ticketFamily(ticketSchema)))
	f.Add([]byte(`{"family":"j","version":"1","template":"{{.Input}}","variants":{"default":{}}}`))
	f.Add([]byte("family: x\nversion: '1'\ntemplate: '{{range .}}{{end}}'\nvariants: {default: {}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		vs, err := prompts.Parse(data)
		if err != nil {
			return
		}
		v, ok := vs[prompts.DefaultVariant]
		if !ok {
			t.Fatal("parsed without a default variant")
		}
		// Whatever loads must validate any output without panicking.
		for _, out := range []string{"", "x", `{"a":[1,{"b":null}]}`, `[1,2]`, `"s"`} {
			_ = v.Validate(out)
		}
	})
}

func TestLoadDirectoryOverridesAndDuplicates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	body := "family: summarize\nversion: '2027-01-01'\ntemplate: 'Shorter: {{.Input}}'\nvariants: {default: {}}\n"
	if err := os.WriteFile(filepath.Join(dir, "summarize.yaml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := prompts.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := r.Render("summarize", "", "x", nil)
	if err != nil || rd.Version != "2027-01-01" || rd.Prompt != "Shorter: x" {
		t.Fatalf("override: %+v %v", rd, err)
	}
	if r.Has("summarize", "digest") {
		t.Error("the replaced family kept the embedded variants")
	}
	if err := os.WriteFile(filepath.Join(dir, "again.yml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := prompts.Load(dir); err == nil || !strings.Contains(err.Error(), "already defined") {
		t.Errorf("two files of one family: %v", err)
	}
	if _, err := prompts.Load(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), prompts.EnvDir) {
		t.Errorf("a missing directory: %v, want an error naming %s", err, prompts.EnvDir)
	}
}

func TestFamilySavingsSettings(t *testing.T) {
	t.Parallel()
	vs, err := prompts.Parse([]byte("family: nightly\nversion: \"1\"\nmode: batch\nbatch_fallback: none\ncontext_cache: true\nsystem: shared\ntemplate: \"{{.Input}}\"\nvariants:\n  default: {}\n  quick: {mode: flex, context_cache: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := vs["default"]; d.Mode != task.ModeBatch || d.BatchFallback != prompts.BatchFallbackNone || !d.ContextCache {
		t.Errorf("default variant %+v", d)
	}
	if q := vs["quick"]; q.Mode != task.ModeFlex || q.ContextCache {
		t.Errorf("quick variant %+v", q)
	}
	for _, bad := range []string{"mode: eventually", "batch_fallback: sometimes"} {
		if _, err := prompts.Parse([]byte("family: x\nversion: \"1\"\n" + bad + "\ntemplate: t\nvariants:\n  default: {}\n")); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
