package worker

import (
	"strings"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// cachedPrefix is what an explicit context cache holds for a call: its family's system
// instruction and, when they come before the prompt, the task's files. Files join the prefix by
// their keys (object, generation, checksums), never by the URI of a task's Files API copy, so
// that the tasks of a tenant naming the same bytes share one cache and a new generation of the
// object gets a new one.
type cachedPrefix struct {
	system string
	files  []gemini.File
}

// prefixOf is the part of req a context cache can hold.
func prefixOf(req gemini.Request) cachedPrefix {
	p := cachedPrefix{system: req.SystemInstruction}
	if !req.FilesAfter {
		p.files = req.Files
	}
	return p
}

// key identifies the prefix: the system instruction alone when it holds no files, as the
// caches of prefixes without files have always been named.
func (p cachedPrefix) key() string {
	if len(p.files) == 0 {
		return p.system
	}
	var b strings.Builder
	b.WriteString(p.system)
	for _, f := range p.files {
		b.WriteString("\x00file:")
		b.WriteString(f.Key)
	}
	return b.String()
}

// tokens is the prefix's estimated size, which must reach minCachedPrefix to be cached.
func (p cachedPrefix) tokens() int64 {
	n := gemini.EstimateTokens(p.system)
	for _, f := range p.files {
		n += gemini.FileTokens(f)
	}
	return n
}

func (p cachedPrefix) empty() bool { return p.system == "" && len(p.files) == 0 }
