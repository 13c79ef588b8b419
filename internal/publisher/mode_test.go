package publisher

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A task's mode is the request's, else its family's default; the task shows it.
func TestSubmitStoresTheEffectiveMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	family := "family: nightly\nversion: \"1\"\nmode: batch\ntemplate: \"{{.Input}}\"\nvariants:\n  default: {}\n"
	if err := os.WriteFile(filepath.Join(dir, "nightly.yaml"), []byte(family), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := prompts.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, func(_ *Config, d *Deps) { d.Families = reg })
	ctx := context.Background()
	for _, tc := range []struct {
		family string
		asked  task.Mode
		stored task.Mode
		shown  task.Mode
	}{
		{"summarize", "", "", task.ModeStandard},
		{"summarize", task.ModeFlex, task.ModeFlex, task.ModeFlex},
		{"nightly", "", task.ModeBatch, task.ModeBatch},
		{"nightly", task.ModeStandard, "", task.ModeStandard},
	} {
		res, err := e.api.Submit(ctx, task.Request{Family: tc.family, Input: "x", Mode: tc.asked})
		if err != nil {
			t.Fatal(err)
		}
		doc, err := e.st.GetTask(ctx, res.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		v, err := e.api.Get(ctx, res.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if doc.Mode != tc.stored || v.Mode != tc.shown {
			t.Errorf("%s asking %q: stored %q shown %q, want %q and %q", tc.family, tc.asked, doc.Mode, v.Mode, tc.stored, tc.shown)
		}
	}
}
