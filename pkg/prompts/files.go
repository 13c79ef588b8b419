package prompts

import (
	"errors"
	"fmt"
	"mime"
	"strings"
)

// Where a family puts a task's files among the parts of its prompt.
const (
	// FilesBefore sends the files, then the rendered prompt (Gemini's advice for one file).
	FilesBefore = "before"
	// FilesAfter sends the rendered prompt, then the files.
	FilesAfter = "after"
)

// DefaultMaxFiles is how many files a task of a family that takes files may carry when the
// family says nothing.
const DefaultMaxFiles = 10

// Files is what a family says of a task's input files: the MIME types it accepts ("image/*"
// accepts every image type), how many at most, whether at least one is required, and where
// they go in the prompt. A family without it refuses files.
type Files struct {
	Accept    []string `json:"accept"`
	Max       int      `json:"max,omitempty"`
	Required  bool     `json:"required,omitempty"`
	Placement string   `json:"placement,omitempty"`
}

// Accepts reports whether the family takes a file of MIME type mimeType.
func (f *Files) Accepts(mimeType string) bool {
	if f == nil {
		return false
	}
	mt, _, err := mime.ParseMediaType(mimeType)
	if err != nil {
		return false
	}
	for _, a := range f.Accept {
		if a == mt || strings.HasSuffix(a, "/*") && strings.HasPrefix(mt, strings.TrimSuffix(a, "*")) {
			return true
		}
	}
	return false
}

// resolveFiles fills the defaults of a family's files and checks them.
func resolveFiles(f *Files) (*Files, error) {
	if f == nil {
		return nil, nil
	}
	out := *f
	if out.Max == 0 {
		out.Max = DefaultMaxFiles
	}
	if out.Placement == "" {
		out.Placement = FilesBefore
	}
	switch {
	case len(out.Accept) == 0:
		return nil, errors.New("files: accept names no MIME type")
	case out.Max < 1:
		return nil, fmt.Errorf("files: max %d: want at least 1", out.Max)
	case out.Placement != FilesBefore && out.Placement != FilesAfter:
		return nil, fmt.Errorf("files: placement %q: want %q or %q", out.Placement, FilesBefore, FilesAfter)
	}
	for _, a := range out.Accept {
		if _, _, err := mime.ParseMediaType(strings.TrimSuffix(a, "*") + "x"); err != nil || !strings.Contains(a, "/") {
			return nil, fmt.Errorf("files: accept %q is not a MIME type", a)
		}
	}
	return &out, nil
}
