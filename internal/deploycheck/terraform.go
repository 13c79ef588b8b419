// Package deploycheck reads genbox's deployment files — the Terraform in infra/terraform, the
// Cloud Build pipeline and the services' Dockerfile — offline, with no provider schema and no
// network, so that tests can hold them to the code: the topics and subscriptions of internal/bus,
// the query registry and index exemptions of internal/store, the environment variables each
// service's config loader reads, the metric names of internal/obs.
//
// Terraform is read with hclsyntax and evaluated the way Terraform would, as far as the checks
// need: variables (defaults or overrides), locals, for_each expansion and dynamic blocks, with
// every resource and data source attribute unknown. A reference to another resource is resolved
// syntactically (Ref), which is how a subscription's topic is matched to the topic's name.
package deploycheck

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// ErrTerraform means the Terraform could not be read or evaluated.
var ErrTerraform = errors.New("deploycheck: terraform")

// Module is one Terraform module directory, evaluated.
type Module struct {
	// Variables holds each variable's value: the override given to LoadModule, else its default.
	Variables map[string]cty.Value
	// Locals holds each local value; attributes that depend on resources are unknown.
	Locals    map[string]cty.Value
	resources []*Resource
	localSrc  map[string]string
	checks    []validation
	funcs     map[string]function.Function
}

// validation is one validation block of a variable.
type validation struct {
	variable  string
	condition hclsyntax.Expression
	message   string
}

// Resource is one resource (or data source) block and its instances.
type Resource struct {
	// Mode is "resource" or "data".
	Mode, Type, Name string
	// Instances holds one instance per for_each element (one with a null key without for_each).
	Instances []*Instance
	Range     hcl.Range
}

// Instance is one instance of a resource: its body, and the each.key / each.value it sees.
type Instance struct {
	Resource *Resource
	Key      cty.Value
	Body     *hclsyntax.Body
	each     cty.Value
	mod      *Module
}

// LoadModule parses every .tf file of dir and evaluates its variables and locals. vars sets or
// overrides variables (a variable without default and without override is unknown).
func LoadModule(dir string, vars map[string]cty.Value) (*Module, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTerraform, err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: no .tf file in %s", ErrTerraform, dir)
	}
	sort.Strings(paths)
	m := &Module{Variables: map[string]cty.Value{}, Locals: map[string]cty.Value{}, localSrc: map[string]string{}, funcs: functions()}
	parser := hclparse.NewParser()
	var bodies []*hclsyntax.Body
	var srcs [][]byte
	for _, p := range paths {
		src, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTerraform, err)
		}
		f, diags := parser.ParseHCL(src, p)
		if diags.HasErrors() {
			return nil, fmt.Errorf("%w: %s", ErrTerraform, diags.Error())
		}
		bodies = append(bodies, f.Body.(*hclsyntax.Body))
		srcs = append(srcs, src)
	}
	locals := map[string]*hclsyntax.Attribute{}
	for i, body := range bodies {
		src := srcs[i]
		for _, b := range body.Blocks {
			switch b.Type {
			case "variable":
				if err := m.addVariable(b, vars); err != nil {
					return nil, err
				}
			case "locals":
				for name, a := range b.Body.Attributes {
					if _, dup := locals[name]; dup {
						return nil, fmt.Errorf("%w: %s: local.%s declared twice", ErrTerraform, a.SrcRange, name)
					}
					locals[name] = a
					m.localSrc[name] = string(a.Expr.Range().SliceBytes(src))
				}
			case "resource", "data":
				if len(b.Labels) != 2 {
					return nil, fmt.Errorf("%w: %s: %s block needs two labels", ErrTerraform, b.DefRange(), b.Type)
				}
				m.resources = append(m.resources, &Resource{Mode: b.Type, Type: b.Labels[0], Name: b.Labels[1], Range: b.DefRange(), Instances: []*Instance{{Body: b.Body}}})
			}
		}
	}
	for name := range vars {
		if _, ok := m.Variables[name]; !ok {
			return nil, fmt.Errorf("%w: override for undeclared variable %q", ErrTerraform, name)
		}
	}
	if err := m.evalLocals(locals); err != nil {
		return nil, err
	}
	for _, r := range m.resources {
		if err := m.expand(r); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Module) addVariable(b *hclsyntax.Block, vars map[string]cty.Value) error {
	if len(b.Labels) != 1 {
		return fmt.Errorf("%w: %s: variable block needs one label", ErrTerraform, b.DefRange())
	}
	name := b.Labels[0]
	if _, dup := m.Variables[name]; dup {
		return fmt.Errorf("%w: %s: variable %q declared twice", ErrTerraform, b.DefRange(), name)
	}
	for _, vb := range b.Body.Blocks {
		if vb.Type != "validation" {
			continue
		}
		cond, ok := vb.Body.Attributes["condition"]
		if !ok {
			return fmt.Errorf("%w: %s: validation without condition", ErrTerraform, vb.DefRange())
		}
		msg := ""
		if a, ok := vb.Body.Attributes["error_message"]; ok {
			if v, diags := a.Expr.Value(nil); !diags.HasErrors() && v.Type() == cty.String && v.IsKnown() {
				msg = v.AsString()
			}
		}
		m.checks = append(m.checks, validation{variable: name, condition: cond.Expr, message: msg})
	}
	if v, ok := vars[name]; ok {
		m.Variables[name] = v
		return nil
	}
	m.Variables[name] = cty.DynamicVal
	if a, ok := b.Body.Attributes["default"]; ok {
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			return fmt.Errorf("%w: %s", ErrTerraform, diags.Error())
		}
		m.Variables[name] = v
	}
	return nil
}

// evalLocals evaluates locals in dependency order; a cycle or an evaluation error is an error.
func (m *Module) evalLocals(locals map[string]*hclsyntax.Attribute) error {
	pending := make(map[string]*hclsyntax.Attribute, len(locals))
	for k, v := range locals {
		pending[k] = v
	}
	for len(pending) > 0 {
		progress := false
		names := make([]string, 0, len(pending))
		for name := range pending {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			a := pending[name]
			if !m.localsReady(a.Expr, locals) {
				continue
			}
			v, diags := a.Expr.Value(m.evalContext(cty.NilVal))
			if diags.HasErrors() {
				return fmt.Errorf("%w: local.%s: %s", ErrTerraform, name, diags.Error())
			}
			m.Locals[name] = v
			delete(pending, name)
			progress = true
		}
		if !progress {
			return fmt.Errorf("%w: locals %v refer to each other in a cycle or to undeclared locals", ErrTerraform, names)
		}
	}
	return nil
}

func (m *Module) localsReady(expr hclsyntax.Expression, declared map[string]*hclsyntax.Attribute) bool {
	for _, t := range expr.Variables() {
		if t.RootName() != "local" || len(t) < 2 {
			continue
		}
		attr, ok := t[1].(hcl.TraverseAttr)
		if !ok {
			continue
		}
		if _, done := m.Locals[attr.Name]; done {
			continue
		}
		if _, exists := declared[attr.Name]; !exists {
			continue // evaluation reports the undeclared local
		}
		return false
	}
	return true
}

// expand evaluates r's for_each (or count) into instances.
func (m *Module) expand(r *Resource) error {
	body := r.Instances[0].Body
	r.Instances = nil
	fe, ok := body.Attributes["for_each"]
	if !ok {
		if c, ok := body.Attributes["count"]; ok {
			v, diags := c.Expr.Value(m.evalContext(cty.NilVal))
			if diags.HasErrors() {
				return fmt.Errorf("%w: %s.%s count: %s", ErrTerraform, r.Type, r.Name, diags.Error())
			}
			if !v.IsKnown() {
				return fmt.Errorf("%w: %s.%s: count is unknown", ErrTerraform, r.Type, r.Name)
			}
			n, err := convert.Convert(v, cty.Number)
			if err != nil {
				return fmt.Errorf("%w: %s.%s count: %w", ErrTerraform, r.Type, r.Name, err)
			}
			count, _ := n.AsBigFloat().Int64()
			for i := int64(0); i < count; i++ {
				r.Instances = append(r.Instances, &Instance{Resource: r, Key: cty.NumberIntVal(i), Body: body, mod: m})
			}
			return nil
		}
		r.Instances = []*Instance{{Resource: r, Key: cty.NilVal, Body: body, mod: m}}
		return nil
	}
	v, diags := fe.Expr.Value(m.evalContext(cty.NilVal))
	if diags.HasErrors() {
		return fmt.Errorf("%w: %s.%s for_each: %s", ErrTerraform, r.Type, r.Name, diags.Error())
	}
	// Terraform needs the keys before apply; a map's values may stay unknown.
	ty := v.Type()
	if !v.IsKnown() || v.IsNull() || (ty.IsSetType() && !v.IsWhollyKnown()) {
		return fmt.Errorf("%w: %s.%s: for_each is not known before apply", ErrTerraform, r.Type, r.Name)
	}
	switch {
	case ty.IsSetType():
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			r.Instances = append(r.Instances, &Instance{Resource: r, Key: e, each: e, Body: body, mod: m})
		}
	case ty.IsMapType() || ty.IsObjectType():
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			r.Instances = append(r.Instances, &Instance{Resource: r, Key: k, each: e, Body: body, mod: m})
		}
	default:
		return fmt.Errorf("%w: %s.%s: for_each must be a set or a map, not %s", ErrTerraform, r.Type, r.Name, ty.FriendlyName())
	}
	return nil
}

// evalContext is the scope of an expression: var, local, each (when given), and every resource
// and data source as an unknown value.
func (m *Module) evalContext(each cty.Value) *hcl.EvalContext {
	vars := map[string]cty.Value{
		"var":   cty.ObjectVal(m.Variables),
		"local": cty.ObjectVal(m.Locals),
	}
	byType := map[string]map[string]cty.Value{}
	data := map[string]map[string]cty.Value{}
	for _, r := range m.resources {
		dst := byType
		if r.Mode == "data" {
			dst = data
		}
		if dst[r.Type] == nil {
			dst[r.Type] = map[string]cty.Value{}
		}
		dst[r.Type][r.Name] = cty.DynamicVal
	}
	for typ, names := range byType {
		vars[typ] = cty.ObjectVal(names)
	}
	dataObj := map[string]cty.Value{}
	for typ, names := range data {
		dataObj[typ] = cty.ObjectVal(names)
	}
	vars["data"] = cty.ObjectVal(dataObj)
	if !isNil(each) {
		vars["each"] = each
	}
	return &hcl.EvalContext{Variables: vars, Functions: m.funcs}
}

// Resources returns the resources of the given type ("data.TYPE" for data sources).
func (m *Module) Resources(typ string) []*Resource {
	mode := "resource"
	if t, ok := strings.CutPrefix(typ, "data."); ok {
		mode, typ = "data", t
	}
	var out []*Resource
	for _, r := range m.resources {
		if r.Mode == mode && r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

// Resource returns the resource TYPE.NAME, or nil.
func (m *Module) Resource(typ, name string) *Resource {
	for _, r := range m.Resources(typ) {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Instances returns every instance of every resource of the given type.
func (m *Module) Instances(typ string) []*Instance {
	var out []*Instance
	for _, r := range m.Resources(typ) {
		out = append(out, r.Instances...)
	}
	return out
}

// Instance returns the instance of r whose key is key (cty.NilVal for a resource without
// for_each), or nil.
func (r *Resource) Instance(key cty.Value) *Instance {
	for _, in := range r.Instances {
		if isNil(in.Key) || isNil(key) {
			if isNil(in.Key) && isNil(key) {
				return in
			}
			continue
		}
		if in.Key.Type().Equals(key.Type()) && in.Key.Equals(key).True() {
			return in
		}
	}
	return nil
}

func isNil(v cty.Value) bool { return v.Type() == cty.NilType }

// String names the instance as Terraform does: type.name["key"].
func (in *Instance) String() string {
	s := in.Resource.Type + "." + in.Resource.Name
	if in.Resource.Mode == "data" {
		s = "data." + s
	}
	switch {
	case isNil(in.Key):
	case in.Key.Type() == cty.String:
		s += fmt.Sprintf("[%q]", in.Key.AsString())
	default:
		s += fmt.Sprintf("[%s]", in.Key.AsBigFloat().String())
	}
	return s
}

func (in *Instance) eachValue() cty.Value {
	if isNil(in.Key) || isNil(in.each) {
		return cty.NilVal
	}
	return cty.ObjectVal(map[string]cty.Value{"key": in.Key, "value": in.each})
}

// Scope is a body of an instance (its own, or a nested block's) with the variables it sees.
type Scope struct {
	Instance *Instance
	Body     *hclsyntax.Body
	ctx      *hcl.EvalContext
}

// Scope returns the instance's top-level body.
func (in *Instance) Scope() Scope {
	return Scope{Instance: in, Body: in.Body, ctx: in.mod.evalContext(in.eachValue())}
}

// Has reports whether the body sets the attribute.
func (s Scope) Has(name string) bool {
	_, ok := s.Body.Attributes[name]
	return ok
}

// Attr evaluates an attribute of the body; a missing attribute is null.
func (s Scope) Attr(name string) (cty.Value, error) {
	a, ok := s.Body.Attributes[name]
	if !ok {
		return cty.NullVal(cty.DynamicPseudoType), nil
	}
	v, diags := a.Expr.Value(s.ctx)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("%w: %s: %s", ErrTerraform, s.Instance, diags.Error())
	}
	return v, nil
}

// String evaluates an attribute that must be a known string.
func (s Scope) String(name string) (string, error) {
	v, err := s.Attr(name)
	if err != nil {
		return "", err
	}
	if v.IsNull() || !v.IsKnown() {
		return "", fmt.Errorf("%w: %s: %s is not a known value", ErrTerraform, s.Instance, name)
	}
	sv, err := convert.Convert(v, cty.String)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %s: %w", ErrTerraform, s.Instance, name, err)
	}
	return sv.AsString(), nil
}

// Blocks returns the nested blocks of the given type, static and generated by dynamic blocks
// (each element of a dynamic block's for_each gives one block, its iterator in scope).
func (s Scope) Blocks(typ string) ([]Scope, error) {
	var out []Scope
	for _, b := range s.Body.Blocks {
		switch {
		case b.Type == typ:
			out = append(out, Scope{Instance: s.Instance, Body: b.Body, ctx: s.ctx})
		case b.Type == "dynamic" && len(b.Labels) == 1 && b.Labels[0] == typ:
			gen, err := s.dynamic(b)
			if err != nil {
				return nil, err
			}
			out = append(out, gen...)
		}
	}
	return out, nil
}

// Block returns the one nested block of the given type; ok is false when there is none.
func (s Scope) Block(typ string) (Scope, bool, error) {
	bs, err := s.Blocks(typ)
	if err != nil || len(bs) == 0 {
		return Scope{}, false, err
	}
	if len(bs) > 1 {
		return Scope{}, false, fmt.Errorf("%w: %s: %d %q blocks, want one", ErrTerraform, s.Instance, len(bs), typ)
	}
	return bs[0], true, nil
}

func (s Scope) dynamic(b *hclsyntax.Block) ([]Scope, error) {
	iterator := b.Labels[0]
	if a, ok := b.Body.Attributes["iterator"]; ok {
		iterator = hcl.ExprAsKeyword(a.Expr)
	}
	fe, ok := b.Body.Attributes["for_each"]
	if !ok {
		return nil, fmt.Errorf("%w: %s: dynamic %q without for_each", ErrTerraform, s.Instance, b.Labels[0])
	}
	v, diags := fe.Expr.Value(s.ctx)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%w: %s: dynamic %q: %s", ErrTerraform, s.Instance, b.Labels[0], diags.Error())
	}
	if !v.IsKnown() || v.IsNull() {
		return nil, fmt.Errorf("%w: %s: dynamic %q: for_each is not known", ErrTerraform, s.Instance, b.Labels[0])
	}
	var content *hclsyntax.Body
	for _, cb := range b.Body.Blocks {
		if cb.Type == "content" {
			content = cb.Body
		}
	}
	if content == nil {
		return nil, fmt.Errorf("%w: %s: dynamic %q without content", ErrTerraform, s.Instance, b.Labels[0])
	}
	var out []Scope
	for it := v.ElementIterator(); it.Next(); {
		k, e := it.Element()
		if v.Type().IsSetType() {
			k = e
		}
		ctx := s.ctx.NewChild()
		ctx.Variables = map[string]cty.Value{iterator: cty.ObjectVal(map[string]cty.Value{"key": k, "value": e})}
		out = append(out, Scope{Instance: s.Instance, Body: content, ctx: ctx})
	}
	return out, nil
}

// Ref is a reference to a resource instance found in an expression.
type Ref struct {
	Type, Name string
	Key        cty.Value // cty.NilVal when not indexed
	Attr       string    // the attribute read, if any
}

// Ref resolves the attribute name of the body, which must be a plain reference such as
// google_pubsub_topic.topics["gemini-tasks"].id or google_pubsub_topic.topics[each.value].name.
func (s Scope) Ref(name string) (Ref, error) {
	a, ok := s.Body.Attributes[name]
	if !ok {
		return Ref{}, fmt.Errorf("%w: %s: no attribute %s", ErrTerraform, s.Instance, name)
	}
	return s.ref(a.Expr, name)
}

func (s Scope) ref(expr hclsyntax.Expression, name string) (Ref, error) {
	var trav hcl.Traversal
	key := cty.NilVal
	switch e := expr.(type) {
	case *hclsyntax.ScopeTraversalExpr:
		trav = e.Traversal
	case *hclsyntax.RelativeTraversalExpr:
		idx, ok := e.Source.(*hclsyntax.IndexExpr)
		if !ok {
			return Ref{}, fmt.Errorf("%w: %s: %s is not a resource reference", ErrTerraform, s.Instance, name)
		}
		coll, ok := idx.Collection.(*hclsyntax.ScopeTraversalExpr)
		if !ok {
			return Ref{}, fmt.Errorf("%w: %s: %s is not a resource reference", ErrTerraform, s.Instance, name)
		}
		k, diags := idx.Key.Value(s.ctx)
		if diags.HasErrors() {
			return Ref{}, fmt.Errorf("%w: %s: %s: %s", ErrTerraform, s.Instance, name, diags.Error())
		}
		key = k
		trav = append(append(hcl.Traversal{}, coll.Traversal...), e.Traversal...)
	default:
		return Ref{}, fmt.Errorf("%w: %s: %s is not a resource reference", ErrTerraform, s.Instance, name)
	}
	var parts []string
	for _, step := range trav {
		switch st := step.(type) {
		case hcl.TraverseRoot:
			parts = append(parts, st.Name)
		case hcl.TraverseAttr:
			parts = append(parts, st.Name)
		case hcl.TraverseIndex:
			key = st.Key
		}
	}
	if len(parts) < 2 || parts[0] == "var" || parts[0] == "local" || parts[0] == "each" {
		return Ref{}, fmt.Errorf("%w: %s: %s is not a resource reference", ErrTerraform, s.Instance, name)
	}
	r := Ref{Type: parts[0], Name: parts[1], Key: key}
	if len(parts) > 2 {
		r.Attr = parts[2]
	}
	return r, nil
}

// Traversal returns the attribute's expression as source text when it is a plain reference
// (local.pubsub_agent, var.x), for checks that a value comes from one named place.
func (s Scope) Traversal(name string) (string, bool) {
	a, ok := s.Body.Attributes[name]
	if !ok {
		return "", false
	}
	e, ok := a.Expr.(*hclsyntax.ScopeTraversalExpr)
	if !ok {
		return "", false
	}
	var b strings.Builder
	for i, step := range e.Traversal {
		switch st := step.(type) {
		case hcl.TraverseRoot:
			b.WriteString(st.Name)
		case hcl.TraverseAttr:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(st.Name)
		default:
			return "", false
		}
	}
	return b.String(), true
}

// CheckValidations evaluates every variable's validation conditions against the values the
// module was loaded with (defaults and overrides), as terraform plan would: a condition that does
// not evaluate, or is false, is an error. A default that fails its own validation, or a
// condition calling a misspelt function, shows up here.
func (m *Module) CheckValidations() []error {
	var errs []error
	ctx := m.evalContext(cty.NilVal)
	for _, c := range m.checks {
		if !m.Variables[c.variable].IsWhollyKnown() {
			continue
		}
		v, diags := c.condition.Value(ctx)
		switch {
		case diags.HasErrors():
			errs = append(errs, fmt.Errorf("variable %q: validation: %s", c.variable, diags.Error()))
		case !v.IsKnown() || v.IsNull() || v.Type() != cty.Bool:
			errs = append(errs, fmt.Errorf("variable %q: validation condition is not a known bool", c.variable))
		case v.False():
			errs = append(errs, fmt.Errorf("variable %q = %s fails its validation: %s", c.variable, m.Variables[c.variable].GoString(), c.message))
		}
	}
	return errs
}

// LocalSource returns the source text of local.name's expression ("" if undeclared), for checks
// on values that stay unknown until apply, such as an address built from the project number.
func (m *Module) LocalSource(name string) string { return m.localSrc[name] }

// Lookup returns the instance a reference points at, or nil.
func (m *Module) Lookup(r Ref) *Instance {
	res := m.Resource(r.Type, r.Name)
	if res == nil {
		return nil
	}
	return res.Instance(r.Key)
}

// functions are the Terraform functions the configuration uses.
func functions() map[string]function.Function {
	to := func(ty cty.Type) function.Function {
		return function.New(&function.Spec{
			Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType, AllowNull: true, AllowUnknown: true, AllowDynamicType: true}},
			Type: func(args []cty.Value) (cty.Type, error) {
				if !ty.IsCollectionType() || ty.ElementType() != cty.DynamicPseudoType {
					return ty, nil
				}
				v, err := convert.Convert(args[0], ty)
				if err != nil {
					return cty.NilType, err
				}
				return v.Type(), nil
			},
			Impl: func(args []cty.Value, retType cty.Type) (cty.Value, error) {
				return convert.Convert(args[0], retType)
			},
		})
	}
	alltrue := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Bool)}},
		Type:   function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			out := cty.True
			for it := args[0].ElementIterator(); it.Next(); {
				_, v := it.Element()
				if !v.IsKnown() {
					return cty.UnknownVal(cty.Bool), nil
				}
				if v.IsNull() || v.False() {
					out = cty.False
				}
			}
			return out, nil
		},
	})
	return map[string]function.Function{
		"alltrue":    alltrue,
		"can":        tryfunc.CanFunc,
		"concat":     stdlib.ConcatFunc,
		"contains":   stdlib.ContainsFunc,
		"floor":      stdlib.FloorFunc,
		"format":     stdlib.FormatFunc,
		"join":       stdlib.JoinFunc,
		"jsonencode": stdlib.JSONEncodeFunc,
		"keys":       stdlib.KeysFunc,
		"length":     stdlib.LengthFunc,
		"lookup":     stdlib.LookupFunc,
		"merge":      stdlib.MergeFunc,
		"regex":      stdlib.RegexFunc,
		"setproduct": stdlib.SetProductFunc,
		"toset":      to(cty.Set(cty.DynamicPseudoType)),
		"tolist":     to(cty.List(cty.DynamicPseudoType)),
		"tomap":      to(cty.Map(cty.DynamicPseudoType)),
		"tostring":   to(cty.String),
		"tonumber":   to(cty.Number),
		"try":        tryfunc.TryFunc,
		"values":     stdlib.ValuesFunc,
	}
}
