// Package prompts owns genbox's task families: for each family and variant, a versioned prompt
// template, a system instruction, generation defaults, a response schema, an output validator,
// whether outputs may be cached, and what to do when every model is unavailable. The built-in
// families are embedded; more are loaded from a directory in the
// same file format (see families/*.yaml). A family may take input files (PDFs, images, audio,
// video): it says which MIME types, how many and where they go in the prompt.
//
// A response schema is JSON Schema (draft 2020-12). The model is sent it as written (Gemini's
// responseJsonSchema), and steers its decoding by the keywords Gemini supports; every output is
// validated against the whole schema, compiled once when the family loads.
package prompts

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"

	"github.com/genbox-dev/genbox/pkg/task"
)

//go:embed families/*.yaml
var embedded embed.FS

// DefaultVariant is the variant used when a request names none.
const DefaultVariant = "default"

// EnvDir is the environment variable naming the directory every service passes to Load: the
// publisher validates requests, the worker renders them and the dlqnotifier prices them with the
// same families.
const EnvDir = "GENBOX_PROMPTS_DIR"

// What a family does when every model of its chain is unavailable.
const (
	// OnExhaustedPark parks the task (waiting) until a model is available again.
	OnExhaustedPark = "park"
	// OnExhaustedStale answers with the last good output of the same tenant and subject_key,
	// flagged stale, instead of parking.
	OnExhaustedStale = "stale"
)

// What a batch task does when a batch can no longer meet its deadline.
const (
	// BatchFallbackOnline runs it online (the standard path) before its deadline.
	BatchFallbackOnline = "online"
	// BatchFallbackNone keeps it for batches until its deadline, then fails it as expired.
	BatchFallbackNone = "none"
)

// MIMEJSON asks the model for JSON output.
const MIMEJSON = "application/json"

// Sentinel errors.
var (
	// ErrUnknown means the family or variant is not in the registry.
	ErrUnknown = errors.New("prompts: unknown family or variant")
	// ErrInvalidOutput means an output failed its family's validator (a quality failure).
	ErrInvalidOutput = errors.New("prompts: invalid output")
	// ErrInvalidConfig means a request's generation overrides are out of the family's bounds.
	ErrInvalidConfig = errors.New("prompts: generation config out of bounds")
)

// Checks is the declarative output validator of a variant.
type Checks struct {
	MinChars int    `json:"min_chars,omitempty"`
	MaxChars int    `json:"max_chars,omitempty"`
	Prefix   string `json:"prefix,omitempty"` // every non-empty line must start with it
}

// spec is one family file, and the shape of each variant's overrides.
type spec struct {
	Family               string           `json:"family"`
	Description          string           `json:"description,omitempty"`
	Version              string           `json:"version,omitempty"`
	Models               []string         `json:"models,omitempty"`
	CacheAllowed         *bool            `json:"cache_allowed,omitempty"`
	OnExhausted          string           `json:"on_exhausted,omitempty"`
	Mode                 task.Mode        `json:"mode,omitempty"`
	BatchFallback        string           `json:"batch_fallback,omitempty"`
	ContextCache         *bool            `json:"context_cache,omitempty"`
	Config               *task.GenConfig  `json:"config,omitempty"`
	MaxOutputTokensLimit int32            `json:"max_output_tokens_limit,omitempty"`
	System               string           `json:"system,omitempty"`
	Template             string           `json:"template,omitempty"`
	ResponseMIMEType     string           `json:"response_mime_type,omitempty"`
	ResponseSchema       any              `json:"response_schema,omitempty"`
	Validate             *Checks          `json:"validate,omitempty"`
	Files                *Files           `json:"files,omitempty"`
	Variants             map[string]*spec `json:"variants,omitempty"`
}

// Variant is one resolved variant of a family: the family's settings with the variant's overrides.
type Variant struct {
	Family, Name, Version string
	Models                []string
	CacheAllowed          bool
	OnExhausted           string
	// Mode is the variant's default mode (standard unless the family says flex or batch).
	Mode task.Mode
	// BatchFallback is what a batch task does when a batch can no longer meet its deadline:
	// BatchFallbackOnline (run it online) or BatchFallbackNone (keep waiting for a batch).
	BatchFallback string
	// ContextCache marks the system instruction (with any fixed documents it holds) as a
	// prefix shared by the family's tasks, worth an explicit context cache when reused enough.
	ContextCache         bool
	Config               task.GenConfig
	MaxOutputTokensLimit int32
	System               string
	ResponseMIMEType     string
	// ResponseSchema is the JSON Schema the model is asked to answer in (Gemini's
	// responseJsonSchema), as the family file wrote it; outputs are validated against it.
	ResponseSchema any
	Checks         Checks
	// Files says which input files the variant takes and where they go; nil refuses files.
	Files  *Files
	schema *jsonschema.Schema // ResponseSchema compiled
	tmpl   *template.Template
}

// Registry holds the known families. It is read-only after loading and safe for concurrent use.
type Registry struct {
	variants map[string]map[string]*Variant // family -> variant -> resolved
}

// Default returns the embedded families: summarize, classify, analyze, and extract, describe
// and transcribe, which read files.
func Default() (*Registry, error) {
	r := &Registry{variants: map[string]map[string]*Variant{}}
	if err := r.addFS(embedded, "families"); err != nil {
		return nil, err
	}
	return r, nil
}

// Load returns the embedded families plus every *.yaml, *.yml or *.json family file in dir
// (EnvDir; "" loads the embedded families alone). A file naming an embedded family replaces it,
// so operators can revise a prompt without a build; its version should change with it. An error
// names EnvDir, so that a service failing to start with it says which setting to fix.
func Load(dir string) (*Registry, error) {
	r, err := Default()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		return r, nil
	}
	if err := r.addFS(os.DirFS(dir), "."); err != nil {
		return nil, fmt.Errorf("%s=%s: %w", EnvDir, dir, err)
	}
	return r, nil
}

func (r *Registry) addFS(fsys fs.FS, dir string) error {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return err
	}
	seen := map[string]string{}
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		data, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, e.Name())))
		if err != nil {
			return err
		}
		vs, err := Parse(data)
		if err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		name := vs[DefaultVariant].Family
		if other, dup := seen[name]; dup {
			return fmt.Errorf("%s: family %q already defined by %s", e.Name(), name, other)
		}
		seen[name] = e.Name()
		r.variants[name] = vs
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// Parse decodes and checks one family file (YAML or JSON) and resolves its variants.
func Parse(data []byte) (map[string]*Variant, error) {
	var s spec
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return nil, fmt.Errorf("decode family: %w", err)
	}
	if !nameRE.MatchString(s.Family) {
		return nil, fmt.Errorf("family name %q: want lower-case letters, digits, - or _", s.Family)
	}
	if _, ok := s.Variants[DefaultVariant]; !ok {
		return nil, fmt.Errorf("family %s: no %q variant", s.Family, DefaultVariant)
	}
	schema, err := compileSchema(s.ResponseSchema)
	if err != nil {
		return nil, fmt.Errorf("%s: response_schema: %w", s.Family, err)
	}
	out := map[string]*Variant{}
	for _, name := range slices.Sorted(maps.Keys(s.Variants)) {
		v, err := resolve(&s, schema, name, s.Variants[name])
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", s.Family, name, err)
		}
		out[name] = v
	}
	return out, nil
}

// resolve applies a variant's overrides to its family (whose response schema compiled to
// schema) and checks the result.
func resolve(f *spec, schema *jsonschema.Schema, name string, o *spec) (*Variant, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("variant name %q: want lower-case letters, digits, - or _", name)
	}
	if o == nil {
		o = &spec{}
	}
	if o.Family != "" || len(o.Variants) > 0 {
		return nil, errors.New("a variant cannot set family or variants")
	}
	v := &Variant{
		Family:               f.Family,
		Name:                 name,
		Version:              pick(o.Version, f.Version),
		Models:               f.Models,
		CacheAllowed:         f.CacheAllowed != nil && *f.CacheAllowed,
		OnExhausted:          pick(o.OnExhausted, f.OnExhausted, OnExhaustedPark),
		Mode:                 task.Mode(pick(string(o.Mode), string(f.Mode), string(task.ModeStandard))),
		BatchFallback:        pick(o.BatchFallback, f.BatchFallback, BatchFallbackOnline),
		ContextCache:         f.ContextCache != nil && *f.ContextCache,
		MaxOutputTokensLimit: f.MaxOutputTokensLimit,
		System:               pick(o.System, f.System),
		ResponseMIMEType:     pick(o.ResponseMIMEType, f.ResponseMIMEType),
		ResponseSchema:       f.ResponseSchema,
		schema:               schema,
	}
	if len(o.Models) > 0 {
		v.Models = o.Models
	}
	if o.CacheAllowed != nil {
		v.CacheAllowed = *o.CacheAllowed
	}
	if o.ContextCache != nil {
		v.ContextCache = *o.ContextCache
	}
	if o.MaxOutputTokensLimit > 0 {
		v.MaxOutputTokensLimit = o.MaxOutputTokensLimit
	}
	if o.ResponseSchema != nil {
		sch, err := compileSchema(o.ResponseSchema)
		if err != nil {
			return nil, fmt.Errorf("response_schema: %w", err)
		}
		v.ResponseSchema, v.schema = o.ResponseSchema, sch
	}
	if f.Config != nil {
		v.Config = merge(v.Config, *f.Config)
	}
	if o.Config != nil {
		v.Config = merge(v.Config, *o.Config)
	}
	switch {
	case o.Validate != nil:
		v.Checks = *o.Validate
	case f.Validate != nil:
		v.Checks = *f.Validate
	}
	if v.MaxOutputTokensLimit == 0 {
		v.MaxOutputTokensLimit = 8192
	}
	files, err := resolveFiles(pickFiles(o.Files, f.Files))
	if err != nil {
		return nil, err
	}
	v.Files = files
	switch {
	case v.Version == "":
		return nil, errors.New("no version")
	case v.OnExhausted != OnExhaustedPark && v.OnExhausted != OnExhaustedStale:
		return nil, fmt.Errorf("on_exhausted %q: want %q or %q", v.OnExhausted, OnExhaustedPark, OnExhaustedStale)
	case !v.Mode.Valid():
		return nil, fmt.Errorf("mode %q: want one of %v", v.Mode, task.Modes)
	case v.BatchFallback != BatchFallbackOnline && v.BatchFallback != BatchFallbackNone:
		return nil, fmt.Errorf("batch_fallback %q: want %q or %q", v.BatchFallback, BatchFallbackOnline, BatchFallbackNone)
	case v.ResponseSchema != nil && v.ResponseMIMEType != MIMEJSON:
		return nil, fmt.Errorf("a response_schema needs response_mime_type %s", MIMEJSON)
	case v.Checks.MinChars < 0 || v.Checks.MaxChars < 0 || (v.Checks.MaxChars > 0 && v.Checks.MaxChars < v.Checks.MinChars):
		return nil, fmt.Errorf("validate: bad bounds min_chars %d max_chars %d", v.Checks.MinChars, v.Checks.MaxChars)
	}
	if err := bounds(v.Config, v.MaxOutputTokensLimit); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	src := pick(o.Template, f.Template)
	if strings.TrimSpace(src) == "" {
		return nil, errors.New("no template")
	}
	tmpl, err := template.New(f.Family + "/" + name).Option("missingkey=error").Parse(src)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	v.tmpl = tmpl
	return v, nil
}

func pickFiles(vals ...*Files) *Files {
	for _, v := range vals {
		if v != nil {
			return v
		}
	}
	return nil
}

func pick(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// merge returns base with every field that over sets.
func merge(base, over task.GenConfig) task.GenConfig {
	if over.Temperature != nil {
		base.Temperature = over.Temperature
	}
	if over.TopP != nil {
		base.TopP = over.TopP
	}
	if over.TopK != nil {
		base.TopK = over.TopK
	}
	if over.MaxOutputTokens != nil {
		base.MaxOutputTokens = over.MaxOutputTokens
	}
	return base
}

// bounds checks a generation config against what Gemini accepts and the family allows.
func bounds(c task.GenConfig, maxOut int32) error {
	switch {
	case c.Temperature != nil && (*c.Temperature < 0 || *c.Temperature > 2):
		return fmt.Errorf("temperature %g: want 0..2", *c.Temperature)
	case c.TopP != nil && (*c.TopP <= 0 || *c.TopP > 1):
		return fmt.Errorf("top_p %g: want (0, 1]", *c.TopP)
	case c.TopK != nil && *c.TopK < 1:
		return fmt.Errorf("top_k %d: want at least 1", *c.TopK)
	case c.MaxOutputTokens != nil && (*c.MaxOutputTokens < 1 || *c.MaxOutputTokens > maxOut):
		return fmt.Errorf("max_output_tokens %d: want 1..%d", *c.MaxOutputTokens, maxOut)
	}
	return nil
}

// Has reports whether the family has the variant ("" is the default variant).
func (r *Registry) Has(family, variant string) bool {
	_, err := r.Variant(family, variant)
	return err == nil
}

// Families returns the known family names, sorted.
func (r *Registry) Families() []string { return slices.Sorted(maps.Keys(r.variants)) }

// Variant returns a resolved variant ("" is the default variant).
func (r *Registry) Variant(family, variant string) (*Variant, error) {
	if variant == "" {
		variant = DefaultVariant
	}
	v, ok := r.variants[family][variant]
	if !ok {
		return nil, fmt.Errorf("%w: %s/%s", ErrUnknown, family, variant)
	}
	return v, nil
}

// Rendered is one request rendered by its family: everything a model call needs.
type Rendered struct {
	Family, Variant, Version string
	SystemInstruction        string
	Prompt                   string
	// Config is the family's defaults merged with the request's overrides.
	Config             task.GenConfig
	ResponseMIMEType   string
	ResponseJSONSchema any
	// Validate checks an output; its errors wrap ErrInvalidOutput and name the family/variant.
	Validate func(output string) error
	// Models is the family's model chain; empty means the configured default.
	Models       []string
	CacheAllowed bool
	// OnExhausted is OnExhaustedPark (default) or OnExhaustedStale.
	OnExhausted string
	// Mode is the family's default mode; BatchFallback its batch fallback.
	Mode          task.Mode
	BatchFallback string
	// ContextCache: the system instruction is a shared prefix, cacheable (Variant.ContextCache).
	ContextCache bool
	// QualityRetry changes the config after a rejected output: LowerTemperature.
	QualityRetry func(task.GenConfig) task.GenConfig
	// FilePlacement is where the task's files go: FilesBefore or FilesAfter the prompt.
	FilePlacement string
}

// Render renders input with the family's variant ("" is the default) and overrides.
func (r *Registry) Render(family, variant, input string, overrides *task.GenConfig) (*Rendered, error) {
	v, err := r.Variant(family, variant)
	if err != nil {
		return nil, err
	}
	cfg := v.Config
	if overrides != nil {
		cfg = merge(cfg, *overrides)
	}
	if err := bounds(cfg, v.MaxOutputTokensLimit); err != nil {
		return nil, fmt.Errorf("%s/%s: %w: %w", v.Family, v.Name, ErrInvalidConfig, err)
	}
	var buf bytes.Buffer
	data := struct{ Input, Family, Variant string }{input, v.Family, v.Name}
	if err := v.tmpl.Execute(&buf, data); err != nil {
		return nil, fmt.Errorf("%s/%s: render: %w", v.Family, v.Name, err)
	}
	return &Rendered{
		Family:             v.Family,
		Variant:            v.Name,
		Version:            v.Version,
		SystemInstruction:  strings.TrimSpace(v.System),
		Prompt:             buf.String(),
		Config:             cfg,
		ResponseMIMEType:   v.ResponseMIMEType,
		ResponseJSONSchema: v.ResponseSchema,
		Validate:           v.Validate,
		Models:             slices.Clone(v.Models),
		CacheAllowed:       v.CacheAllowed,
		OnExhausted:        v.OnExhausted,
		Mode:               v.Mode,
		BatchFallback:      v.BatchFallback,
		ContextCache:       v.ContextCache,
		QualityRetry:       LowerTemperature,
		FilePlacement:      filePlacement(v.Files),
	}, nil
}

func filePlacement(f *Files) string {
	if f == nil {
		return ""
	}
	return f.Placement
}

// LowerTemperature is the change of conditions after a rejected output: half the temperature
// (1.0 when none was set, Gemini's usual default), rounded to two decimals, down to 0.
func LowerTemperature(cfg task.GenConfig) task.GenConfig {
	t := 1.0
	if cfg.Temperature != nil {
		t = *cfg.Temperature
	}
	t = math.Round(t/2*100) / 100
	cfg.Temperature = &t
	return cfg
}
