// Package envconfig is the one way genbox reads typed settings from the environment. Every
// Config.FromEnv builds a Reader over its getenv, points each variable at the field holding its
// default, and collects in one error every value that does not parse, each naming its variable.
//
// Every method calls getenv for its name, set or not: the Terraform test records the names a
// service asks for to check the Cloud Run environment against them.
//
//	r := envconfig.New(getenv)
//	r.Duration("GENBOX_LEASE_TTL", &c.LeaseTTL)
//	r.Int("GENBOX_CONCURRENCY", &c.Concurrency)
//	if err := r.Err(); err != nil { ... }
package envconfig

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Reader reads variables through getenv and remembers every value that did not parse. An unset
// or empty variable leaves its destination (the default) untouched; so does a bad value.
type Reader struct {
	getenv func(string) string
	errs   []error
}

// New returns a Reader over getenv (os.Getenv in a service, a map in tests).
func New(getenv func(string) string) *Reader { return &Reader{getenv: getenv} }

// Error is a value that did not parse; Err is the parser's error.
type Error struct {
	Name  string // the variable
	Value string // what it held
	Kind  string // what it should have been, e.g. "an integer"; empty for a custom parser
	Err   error
}

func (e *Error) Error() string {
	if e.Kind == "" {
		return fmt.Sprintf("%s: %v", e.Name, e.Err)
	}
	return fmt.Sprintf("%s: %q is not %s", e.Name, e.Value, e.Kind)
}

// Unwrap returns the parser's error.
func (e *Error) Unwrap() error { return e.Err }

// String sets *dst to the variable's value when it is set.
func (r *Reader) String(name string, dst *string) {
	if s := r.getenv(name); s != "" {
		*dst = s
	}
}

// List sets *dst to the variable's comma-separated items, trimmed, empty ones dropped, when it
// is set (so " , " gives an empty list).
func (r *Reader) List(name string, dst *[]string) {
	if s := r.getenv(name); s != "" {
		*dst = Split(s)
	}
}

// Split returns the comma-separated items of s, trimmed, empty ones dropped.
func Split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Int sets *dst to the variable's decimal integer when it is set.
func (r *Reader) Int(name string, dst *int) {
	parse(r, name, dst, "an integer", strconv.Atoi)
}

// Port sets *dst to the variable's TCP port, 0 to 65535 (0: any free port), when it is set.
func (r *Reader) Port(name string, dst *int) {
	parse(r, name, dst, "a port (0-65535)", func(s string) (int, error) {
		n, err := strconv.ParseUint(s, 10, 16)
		return int(n), err
	})
}

// Int64 sets *dst to the variable's decimal 64-bit integer when it is set.
func (r *Reader) Int64(name string, dst *int64) {
	parse(r, name, dst, "an integer", func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
}

// Float sets *dst to the variable's number when it is set (strconv.ParseFloat: NaN and Inf
// parse; Validate bounds them).
func (r *Reader) Float(name string, dst *float64) {
	parse(r, name, dst, "a number", func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
}

// Bool sets *dst to the variable's boolean (strconv.ParseBool) when it is set.
func (r *Reader) Bool(name string, dst *bool) {
	parse(r, name, dst, "a boolean", strconv.ParseBool)
}

// Duration sets *dst to the variable's duration (time.ParseDuration) when it is set.
func (r *Reader) Duration(name string, dst *time.Duration) {
	parse(r, name, dst, "a duration (e.g. 30s, 24h)", time.ParseDuration)
}

// Func calls set with the variable's value when it is set; an error it returns is recorded
// under the variable's name.
func (r *Reader) Func(name string, set func(string) error) {
	if s := r.getenv(name); s != "" {
		if err := set(s); err != nil {
			r.errs = append(r.errs, &Error{Name: name, Value: s, Err: err})
		}
	}
}

// Err joins the errors of every value that did not parse (each an *Error), or returns nil.
func (r *Reader) Err() error { return errors.Join(r.errs...) }

func parse[T any](r *Reader, name string, dst *T, kind string, p func(string) (T, error)) {
	s := r.getenv(name)
	if s == "" {
		return
	}
	v, err := p(s)
	if err != nil {
		r.errs = append(r.errs, &Error{Name: name, Value: s, Kind: kind, Err: err})
		return
	}
	*dst = v
}
