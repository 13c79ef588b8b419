package gemini_test

import (
	"testing"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := func() gemini.Request {
		return gemini.Request{
			TaskID: "a", Tenant: "t1", Models: []string{"m1", "m2"}, SystemInstruction: "sys", Prompt: "p",
			Config:           task.GenConfig{Temperature: ptr(0.3), MaxOutputTokens: ptr(int32(100))},
			ResponseMIMEType: "application/json", ResponseJSONSchema: map[string]any{"type": "object"},
		}
	}
	ref := gemini.Fingerprint("t1", base(), "v1")
	same := base()
	same.TaskID = "other task" // the task id and the budget do not shape the output
	same.MaxCostUSD = 1
	if got := gemini.Fingerprint("t1", same, "v1"); got != ref {
		t.Errorf("identical requests differ: %s vs %s", got, ref)
	}
	for name, tc := range map[string]struct {
		tenant, version string
		edit            func(*gemini.Request)
	}{
		"tenant":            {"t2", "v1", nil},
		"prompt version":    {"t1", "v2", nil},
		"temperature":       {"t1", "v1", func(r *gemini.Request) { r.Config.Temperature = ptr(0.4) }},
		"temperature unset": {"t1", "v1", func(r *gemini.Request) { r.Config.Temperature = nil }},
		"zero temperature":  {"t1", "v1", func(r *gemini.Request) { r.Config.Temperature = ptr(0.0) }},
		"top_p":             {"t1", "v1", func(r *gemini.Request) { r.Config.TopP = ptr(0.9) }},
		"top_k":             {"t1", "v1", func(r *gemini.Request) { r.Config.TopK = ptr(int32(4)) }},
		"max output":        {"t1", "v1", func(r *gemini.Request) { r.Config.MaxOutputTokens = ptr(int32(101)) }},
		"prompt":            {"t1", "v1", func(r *gemini.Request) { r.Prompt = "q" }},
		"system":            {"t1", "v1", func(r *gemini.Request) { r.SystemInstruction = "sys2" }},
		"primary model":     {"t1", "v1", func(r *gemini.Request) { r.Models = []string{"m2", "m1"} }},
		"schema":            {"t1", "v1", func(r *gemini.Request) { r.ResponseJSONSchema = map[string]any{"type": "array"} }},
		"mime":              {"t1", "v1", func(r *gemini.Request) { r.ResponseMIMEType = "" }},
		"boundary":          {"t1", "v1", func(r *gemini.Request) { r.SystemInstruction, r.Prompt = "sy", "sp" }},
	} {
		r := base()
		if tc.edit != nil {
			tc.edit(&r)
		}
		if got := gemini.Fingerprint(tc.tenant, r, tc.version); got == ref {
			t.Errorf("%s: same fingerprint", name)
		}
	}
}
