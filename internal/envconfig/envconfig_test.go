package envconfig_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/envconfig"
)

// settings is one destination of every kind, with its defaults.
type settings struct {
	S   string
	L   []string
	I   int
	P   int
	I64 int64
	F   float64
	B   bool
	D   time.Duration
	Fn  string
}

func defaults() settings {
	return settings{S: "def", L: []string{"a"}, I: 7, P: 8080, I64: 1 << 40, F: 0.5, D: time.Second, Fn: "fn"}
}

var names = []string{"S", "L", "I", "P", "I64", "F", "B", "D", "FN"}

func read(env map[string]string) (settings, []string, error) {
	var asked []string
	r := envconfig.New(func(k string) string { asked = append(asked, k); return env[k] })
	c := defaults()
	r.String("S", &c.S)
	r.List("L", &c.L)
	r.Int("I", &c.I)
	r.Port("P", &c.P)
	r.Int64("I64", &c.I64)
	r.Float("F", &c.F)
	r.Bool("B", &c.B)
	r.Duration("D", &c.D)
	r.Func("FN", func(s string) error {
		if s != strings.ToUpper(s) {
			return fmt.Errorf("%q is not upper case", s)
		}
		c.Fn = s
		return nil
	})
	return c, asked, r.Err()
}

func TestReader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want func(*settings)
	}{
		{"unset keeps defaults", nil, func(*settings) {}},
		{"empty keeps defaults", map[string]string{"S": "", "I": "", "D": "", "B": "", "L": ""}, func(*settings) {}},
		{"string", map[string]string{"S": "x"}, func(c *settings) { c.S = "x" }},
		{"list trimmed", map[string]string{"L": " b, ,c "}, func(c *settings) { c.L = []string{"b", "c"} }},
		{"list of nothing", map[string]string{"L": " , "}, func(c *settings) { c.L = nil }},
		{"int", map[string]string{"I": "-3"}, func(c *settings) { c.I = -3 }},
		{"port", map[string]string{"P": "9090"}, func(c *settings) { c.P = 9090 }},
		{"port 0 (any free one)", map[string]string{"P": "0"}, func(c *settings) { c.P = 0 }},
		{"int64", map[string]string{"I64": "2048"}, func(c *settings) { c.I64 = 2048 }},
		{"float", map[string]string{"F": "0.25"}, func(c *settings) { c.F = 0.25 }},
		{"bool", map[string]string{"B": "true"}, func(c *settings) { c.B = true }},
		{"duration", map[string]string{"D": "150ms"}, func(c *settings) { c.D = 150 * time.Millisecond }},
		{"func", map[string]string{"FN": "UP"}, func(c *settings) { c.Fn = "UP" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, asked, err := read(tt.env)
			if err != nil {
				t.Fatal(err)
			}
			want := defaults()
			tt.want(&want)
			if got.S != want.S || !slices.Equal(got.L, want.L) || got.I != want.I || got.P != want.P || got.I64 != want.I64 ||
				got.F != want.F || got.B != want.B || got.D != want.D || got.Fn != want.Fn {
				t.Errorf("read %+v, want %+v", got, want)
			}
			if !slices.Equal(asked, names) {
				t.Errorf("asked for %v, want every name %v", asked, names)
			}
		})
	}
}

func TestReaderErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
		cause       error // what the error unwraps to, nil for the custom parser
	}{
		{"I", "x", strconv.ErrSyntax},
		{"I", "99999999999999999999", strconv.ErrRange},
		{"P", "http", strconv.ErrSyntax},
		{"P", "65536", strconv.ErrRange},
		{"P", "-1", strconv.ErrSyntax},
		{"I64", "1.5", strconv.ErrSyntax},
		{"F", "fast", strconv.ErrSyntax},
		{"B", "maybe", strconv.ErrSyntax},
		{"D", "soon", nil},
		{"FN", "low", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			got, asked, err := read(map[string]string{tt.name: tt.value})
			var e *envconfig.Error
			if !errors.As(err, &e) || e.Name != tt.name || e.Value != tt.value || e.Err == nil {
				t.Fatalf("err %#v, want an *envconfig.Error for %s=%q", err, tt.name, tt.value)
			}
			if !strings.HasPrefix(err.Error(), tt.name+": ") || !strings.Contains(err.Error(), tt.value) {
				t.Errorf("message %q does not name %s and its value", err, tt.name)
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Errorf("err %v does not wrap %v", err, tt.cause)
			}
			if want := defaults(); got.I != want.I || got.P != want.P || got.I64 != want.I64 || got.F != want.F || got.B != want.B ||
				got.D != want.D || got.Fn != want.Fn {
				t.Errorf("a bad value changed a setting: %+v", got)
			}
			if !slices.Equal(asked, names) {
				t.Errorf("asked for %v, want every name %v", asked, names)
			}
		})
	}
}

func TestReaderJoinsEveryError(t *testing.T) {
	t.Parallel()
	_, _, err := read(map[string]string{"I": "x", "D": "soon", "B": "maybe", "S": "fine"})
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 3 {
		t.Fatalf("err %v, want the three bad values joined", err)
	}
	for _, name := range []string{"I: ", "D: ", "B: "} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%q does not name %s", err, name)
		}
	}
}
