package deploycheck_test

import (
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// configDoc is the page that lists every environment variable.
const configDoc = repoRoot + "/docs/configuration.md"

// TestConfigDocListsEveryVariable holds docs/configuration.md to the code: every environment
// variable a service's config loader reads is named, in backquotes, in one of its tables, so the
// documented configuration cannot drift.
func TestConfigDocListsEveryVariable(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	var rows strings.Builder
	for line := range strings.Lines(string(doc)) {
		if strings.HasPrefix(line, "|") {
			rows.WriteString(line)
		}
	}
	read := map[string][]string{}
	for svc, s := range services {
		_ = s.load(func(name string) string {
			if !slices.Contains(read[name], svc) {
				read[name] = append(read[name], svc)
			}
			return ""
		})
	}
	if len(read) == 0 {
		t.Fatal("the loaders read no variable: the recorder is broken")
	}
	for _, name := range slices.Sorted(maps.Keys(read)) {
		if !strings.Contains(rows.String(), "`"+name+"`") {
			slices.Sort(read[name])
			t.Errorf("docs/configuration.md has no table row for `%s` (read by %s)", name, strings.Join(read[name], ", "))
		}
	}
}

// upstreamDocs are the hosts the documentation may link to: public upstream documentation. Every
// other link stays inside the repository.
var upstreamDocs = []string{
	"go.dev", "cloud.google.com", "www.standardwebhooks.com", "api.slack.com", "ai.google.dev",
}

// markdownLink matches [text](target); the target ends at a space or the closing parenthesis.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestDocsLinksStayInTheRepository reads README.md and docs/*.md: every relative link names a file
// of the repository (and, with a #fragment, a heading of that page), every absolute one a public
// upstream documentation site, and nothing points outside the clone (../shared, DESIGN.md).
func TestDocsLinksStayInTheRepository(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(repoRoot, "README.md"))
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages {
		name, _ := filepath.Rel(repoRoot, page)
		src, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"../shared", "DESIGN.md"} {
			if strings.Contains(string(src), bad) {
				t.Errorf("%s mentions %s, which a clone of the repository does not have", name, bad)
			}
		}
		for _, target := range links(string(src)) {
			u, err := url.Parse(target)
			if err != nil {
				t.Errorf("%s: link %q: %v", name, target, err)
				continue
			}
			if u.Scheme != "" {
				if u.Scheme != "https" || !slices.Contains(upstreamDocs, u.Host) {
					t.Errorf("%s: link %q leaves the repository; only https links to upstream documentation (%s) may", name, target, strings.Join(upstreamDocs, ", "))
				}
				continue
			}
			file := page
			if u.Path != "" {
				file = filepath.Join(filepath.Dir(page), filepath.FromSlash(u.Path))
				abs, err := filepath.Abs(file)
				if err != nil {
					t.Fatal(err)
				}
				if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
					t.Errorf("%s: link %q leaves the repository", name, target)
					continue
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q names no file of the repository", name, target)
					continue
				}
			}
			if u.Fragment == "" {
				continue
			}
			dst, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("%s: link %q: %v", name, target, err)
				continue
			}
			if !slices.Contains(anchors(string(dst)), u.Fragment) {
				t.Errorf("%s: link %q names no heading of %s (it has %s)", name, target, filepath.Base(file), strings.Join(anchors(string(dst)), ", "))
			}
		}
	}
}

// TestReadmeFitsOneScreen keeps the README what a newcomer reads first: under 150 lines, the
// reference material in docs/.
func TestReadmeFitsOneScreen(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(src), "\n"); n >= 150 {
		t.Errorf("README.md has %d lines; keep it under 150 and move reference material to docs/", n)
	}
}

// prose yields the lines of a Markdown page outside fenced code blocks.
func prose(src string) []string {
	var out []string
	fenced := false
	for line := range strings.Lines(src) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// inlineCode matches `code` spans, whose brackets are not links.
var inlineCode = regexp.MustCompile("`[^`]*`")

// links returns the targets of the page's Markdown links.
func links(src string) []string {
	var out []string
	for _, line := range prose(src) {
		for _, m := range markdownLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// anchors returns the fragment ids GitHub gives the page's headings: lowercased, punctuation
// dropped, spaces turned into hyphens, a repeated id suffixed -1, -2, ...
func anchors(src string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range prose(src) {
		text, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !strings.HasPrefix(line, "#") || !ok {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(text)) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			seen[id] = n + 1
			id += "-" + strconv.Itoa(n)
		} else {
			seen[id] = 1
		}
		out = append(out, id)
	}
	return out
}
