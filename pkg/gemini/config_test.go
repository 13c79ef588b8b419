package gemini_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// DefaultConfig needs only credentials to be a working policy, and reads no environment.
func TestDefaultConfig(t *testing.T) {
	t.Setenv("GENBOX_MAX_ATTEMPTS", "1")
	c := gemini.DefaultConfig()
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "GEMINI_API_KEY") {
		t.Errorf("Validate without credentials = %v, want an error asking for the key", err)
	}
	c.APIKey = "k"
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate with a key = %v", err)
	}
	if c.MaxAttempts != 8 || !slices.Equal(c.Models, gemini.DefaultModelChain) || c.Breaker.ConsecutiveFailures != 5 {
		t.Errorf("defaults %+v", c)
	}
	if p := gemini.DefaultPricing(); !slices.Equal(p.Models, gemini.DefaultModelChain) || p.DefaultMaxOutputTokens != 8192 {
		t.Errorf("default pricing %+v", p)
	}
}

func FuzzParsePrices(f *testing.F) {
	f.Add("gemini-2.5-flash=0.3/2.5,m=1/2")
	f.Add("m=1/2;flex=0.5/1;batch=0.5/1;cached=0.1;storage=1")
	f.Add("=/")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := gemini.ParsePrices(s)
		if err != nil {
			return
		}
		for m, v := range p {
			all := []float64{v.InputPerM, v.OutputPerM, v.FlexInputPerM, v.FlexOutputPerM, v.BatchInputPerM, v.BatchOutputPerM, v.CachedInputPerM, v.StoragePerMHour}
			bad := m == ""
			for _, x := range all {
				bad = bad || !(x >= 0) || math.IsInf(x, 0)
			}
			if bad {
				t.Fatalf("accepted %q: %q %+v", s, m, v)
			}
		}
	})
}
