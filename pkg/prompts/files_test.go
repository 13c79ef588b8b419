package prompts_test

import (
	"strings"
	"testing"

	"github.com/genbox-dev/genbox/pkg/prompts"
)

func TestFileFamilies(t *testing.T) {
	t.Parallel()
	r := registry(t)
	for _, tc := range []struct {
		family, mime string
		want         bool
	}{
		{"extract", "application/pdf", true},
		{"extract", "image/png", true},
		{"extract", "audio/mpeg", false},
		{"describe", "image/webp", true},
		{"describe", "image/png; charset=x", true},
		{"describe", "application/pdf", false},
		{"transcribe", "audio/wav", true},
		{"transcribe", "video/mp4", false},
		{"summarize", "application/pdf", false},
	} {
		v, err := r.Variant(tc.family, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := v.Files.Accepts(tc.mime); got != tc.want {
			t.Errorf("%s accepts %s: %v, want %v", tc.family, tc.mime, got, tc.want)
		}
	}
	v, _ := r.Variant("transcribe", "")
	if v.Files.Max != 1 || !v.Files.Required || v.Files.Placement != prompts.FilesBefore {
		t.Errorf("transcribe files %+v, want one required file before the prompt", *v.Files)
	}
	rd, err := r.Render("extract", "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rd.FilePlacement != prompts.FilesBefore || !strings.Contains(rd.Prompt, "every field") {
		t.Errorf("extract without input: placement %q, prompt %q", rd.FilePlacement, rd.Prompt)
	}
}

func TestFilesSpecIsChecked(t *testing.T) {
	t.Parallel()
	base := "family: f\nversion: \"1\"\ntemplate: x\nvariants:\n  default: {}\n"
	for _, files := range []string{
		"files: {accept: []}",
		"files: {accept: [pdf]}",
		"files: {accept: [application/pdf], max: -1}",
		"files: {accept: [application/pdf], placement: middle}",
	} {
		if _, err := prompts.Parse([]byte(base + files + "\n")); err == nil {
			t.Errorf("Parse accepted %s", files)
		}
	}
	vs, err := prompts.Parse([]byte(base + "files: {accept: [\"video/*\"], placement: after}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f := vs["default"].Files; f.Max != prompts.DefaultMaxFiles || !f.Accepts("video/mp4") {
		t.Errorf("files %+v: want the default max and video accepted", *f)
	}
}
