package geminienv_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

func env(m map[string]string, asked *[]string) func(string) string {
	return func(k string) string {
		if asked != nil {
			*asked = append(*asked, k)
		}
		return m[k]
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	var asked []string
	c, err := geminienv.Config(env(map[string]string{
		"GEMINI_API_KEY":        "k",
		"GENBOX_RPM":            "gemini-2.5-flash=1000, gemini-2.5-flash-lite=4000",
		"GENBOX_TPM":            "gemini-2.5-flash=1000000",
		"GENBOX_PRICES":         "gemini-2.5-flash=0.3/2.5",
		"GENBOX_INSTANCE_SHARE": "0.25",
		"GENBOX_BACKOFF_BASE":   "200ms",
	}, &asked))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Models, gemini.DefaultModelChain) || c.RPM["gemini-2.5-flash-lite"] != 4000 || c.TPM["gemini-2.5-flash"] != 1e6 {
		t.Errorf("config %+v", c)
	}
	if c.InstanceShare != 0.25 || c.BackoffBase != 200*time.Millisecond || c.Prices["gemini-2.5-flash"].OutputPerM != 2.5 {
		t.Errorf("config %+v", c)
	}
	if c.Breaker.ConsecutiveFailures != 5 || c.Breaker.Window != 5*time.Minute || c.Breaker.FailureRatio != 0.5 {
		t.Errorf("breaker defaults %+v", c.Breaker)
	}
	for _, name := range []string{"GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GENBOX_GEMINI_BACKEND", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION", "GENBOX_MODEL_CHAIN", "GENBOX_MAX_ATTEMPTS", "GENBOX_RPM", "GENBOX_TPM", "GENBOX_INSTANCE_SHARE", "GENBOX_PRICES", "GENBOX_BREAKER_COOLDOWN"} {
		if !slices.Contains(asked, name) {
			t.Errorf("%s never read", name)
		}
	}
}

// A service that only prices calls reads GENBOX_MODEL_CHAIN and GENBOX_PRICES without model
// credentials and prices every request as a client built from the same environment does.
func TestPricingPricesAsTheClient(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"GENBOX_MODEL_CHAIN": "cheap,dear", "GENBOX_PRICES": "cheap=0.1/0.4,dear=2/8"}
	var asked []string
	p, err := geminienv.Pricing(env(vars, &asked))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"GENBOX_MODEL_CHAIN", "GENBOX_PRICES"} {
		if !slices.Contains(asked, name) {
			t.Errorf("%s never read", name)
		}
	}
	vars["GOOGLE_GEMINI_BASE_URL"] = "http://127.0.0.1:1"
	cfg, err := geminienv.Config(env(vars, nil))
	if err != nil {
		t.Fatal(err)
	}
	client, err := gemini.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	short := gemini.Request{Prompt: "a short text"}
	long := gemini.Request{Prompt: strings.Repeat("a much longer text ", 20000)}
	ownChain := gemini.Request{Prompt: "a short text", Models: []string{"cheap"}}
	for _, req := range []gemini.Request{short, long, ownChain} {
		pt, pc := p.Estimate(req)
		ct, cc := client.Estimate(req)
		if pt != ct || pc != cc {
			t.Errorf("%d-byte prompt on %v: pricing %d tokens $%g, client %d tokens $%g", len(req.Prompt), req.Models, pt, pc, ct, cc)
		}
	}
	_, shortUSD := p.Estimate(short)
	_, longUSD := p.Estimate(long)
	_, cheapUSD := p.Estimate(ownChain)
	if !(longUSD > shortUSD && shortUSD > cheapUSD && cheapUSD > 0) {
		t.Errorf("long $%g, short $%g, short on the cheap model $%g: want the longer prompt and the dearer chain to cost more", longUSD, shortUSD, cheapUSD)
	}
	for name, bad := range map[string]string{"GENBOX_PRICES": "cheap=1", "GENBOX_MODEL_CHAIN": " , "} {
		if _, err := geminienv.Pricing(env(map[string]string{name: bad}, nil)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: err = %v, want it to name the variable", name, bad, err)
		}
	}
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"no key":      {map[string]string{}, "GEMINI_API_KEY"},
		"backend":     {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_GEMINI_BACKEND": "openai"}, "GENBOX_GEMINI_BACKEND"},
		"vertex":      {map[string]string{"GENBOX_GEMINI_BACKEND": "vertex"}, "GOOGLE_CLOUD_PROJECT"},
		"rpm":         {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_RPM": "m=fast"}, "GENBOX_RPM"},
		"rpm zero":    {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_RPM": "m=0"}, "GENBOX_RPM"},
		"rpm nan":     {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_RPM": "m=NaN"}, "GENBOX_RPM"},
		"price inf":   {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_PRICES": "m=Inf/1"}, "GENBOX_PRICES"},
		"prices":      {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_PRICES": "m=1"}, "GENBOX_PRICES"},
		"share":       {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_INSTANCE_SHARE": "2"}, "GENBOX_INSTANCE_SHARE"},
		"share nan":   {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_INSTANCE_SHARE": "NaN"}, "GENBOX_INSTANCE_SHARE"},
		"attempts":    {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_MAX_ATTEMPTS": "0"}, "GENBOX_MAX_ATTEMPTS"},
		"duration":    {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_CALL_TIMEOUT": "soon"}, "GENBOX_CALL_TIMEOUT"},
		"empty chain": {map[string]string{"GEMINI_API_KEY": "k", "GENBOX_MODEL_CHAIN": " , "}, "GENBOX_MODEL_CHAIN"},
	} {
		_, err := geminienv.Config(env(tc.env, nil))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to name %s", name, err, tc.want)
		}
	}
	if _, err := geminienv.Config(env(map[string]string{"GENBOX_GEMINI_BACKEND": "vertex", "GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_CLOUD_LOCATION": "us-central1"}, nil)); err != nil {
		t.Errorf("vertex: %v", err)
	}
}
