package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"short text unchanged", "receiver refused: 404 Not Found", "receiver refused: 404 Not Found"},
		{"query redacted", `Post "https://app.example/hook?token=s3cret&x=1": dial tcp: i/o timeout`,
			`Post "https://app.example/hook?REDACTED": dial tcp: i/o timeout`},
		{"fragment redacted", "to https://app.example/a#frag", "to https://app.example/a?REDACTED"},
		{"userinfo dropped", "https://user:pw@app.example/hook failed", "https://app.example/hook failed"},
		{"redirect target redacted", `redirect: 302 to "https://evil.example/x?code=abc"`, `redirect: 302 to "https://evil.example/x?REDACTED"`},
		{"invalid UTF-8 replaced", "bad \xff byte", "bad \uFFFD byte"},
		{"long text cut", strings.Repeat("a", 600), strings.Repeat("a", MaxError-len(Ellipsis)) + Ellipsis},
		{"cut on a rune boundary", strings.Repeat("é", 300), strings.Repeat("é", (MaxError-len(Ellipsis))/2) + Ellipsis},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Error(tc.in); got != tc.want {
				t.Errorf("Error(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestErrorBoundsAMultiMegabyteText(t *testing.T) {
	t.Parallel()
	in := `redirect: 302 to "https://evil.example/?q=` + strings.Repeat("x", 3<<20) + `"`
	got := Error(in)
	if want := `redirect: 302 to "https://evil.example/?REDACTED`; !strings.HasPrefix(got, want) || len(got) > MaxError {
		t.Errorf("Error of %d bytes = %q (%d bytes), want a prefix %q and at most %d bytes", len(in), got, len(got), want, MaxError)
	}
}

func TestSlack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		n        int
		want     string
	}{
		{"plain text unchanged", "HTTP 404", 100, "HTTP 404"},
		{"mention and link neutralised", `302 to "<!channel> <https://evil|Approve>"`, 100,
			`302 to "&lt;!channel&gt; &lt;https://evil|Approve&gt;"`},
		{"ampersand escaped", "a & b &amp; c", 100, "a &amp; b &amp;amp; c"},
		{"cut never splits an escape", "ab<<<<", 10, "ab&lt;" + Ellipsis},
		{"fits exactly", "a<b", 6, "a&lt;b"},
		{"too small for anything", "<<", 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Slack(tc.in, tc.n); got != tc.want {
				t.Errorf("Slack(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
		})
	}
}

// FuzzSlackEscape holds Slack to its promise for any text and bound: no raw angle bracket, every
// ampersand the start of one of the three escapes, valid UTF-8, at most n bytes, and text
// without anything to escape that fits passes unchanged.
func FuzzSlackEscape(f *testing.F) {
	for _, s := range []string{"", "<!channel> <https://evil|Approve>", "&amp;&lt;", "a\xffb<", strings.Repeat("<&>", 200), "é<é"} {
		f.Add(s, 40)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		n = max(n, 0) % 2048
		got := Slack(s, n)
		if len(got) > n {
			t.Fatalf("Slack(%q, %d) = %q: %d bytes", s, n, got, len(got))
		}
		if strings.ContainsAny(got, "<>") {
			t.Fatalf("Slack(%q, %d) = %q: a raw angle bracket", s, n, got)
		}
		for i := strings.IndexByte(got, '&'); i >= 0; i = next(got, i) {
			rest := got[i:]
			if !strings.HasPrefix(rest, "&amp;") && !strings.HasPrefix(rest, "&lt;") && !strings.HasPrefix(rest, "&gt;") {
				t.Fatalf("Slack(%q, %d) = %q: an unescaped & at %d", s, n, got, i)
			}
		}
		if !utf8.ValidString(got) {
			t.Fatalf("Slack(%q, %d) = %q: invalid UTF-8", s, n, got)
		}
		if len(s) <= n && utf8.ValidString(s) && !strings.ContainsAny(s, "<>&") && got != s {
			t.Fatalf("Slack(%q, %d) = %q: changed text with nothing to escape", s, n, got)
		}
	})
}

// next is the index of the & after the one at i, or -1.
func next(s string, i int) int {
	j := strings.IndexByte(s[i+1:], '&')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// FuzzError holds Error to its bound, to valid UTF-8, to leaving no query string after a URL it
// recognised, and to idempotence (the store bounds again what the services bounded).
func FuzzError(f *testing.F) {
	for _, s := range []string{"", `Post "https://a.example/h?t=1": EOF`, "https://u:p@h/x#f", "x://?a://b", strings.Repeat("é", 400)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Error(s)
		if len(got) > MaxError || !utf8.ValidString(got) {
			t.Fatalf("Error(%q) = %q: %d bytes, valid UTF-8 %t", s, got, len(got), utf8.ValidString(got))
		}
		if again := Error(got); again != got {
			t.Fatalf("Error is not idempotent: %q, then %q", got, again)
		}
		for _, u := range urlPattern.FindAllString(got, -1) {
			if q := strings.IndexAny(u, "?#"); q >= 0 && u[q:] != Redacted && !strings.HasPrefix(Redacted, u[q:]) {
				t.Fatalf("Error(%q) = %q: %q keeps a query or fragment", s, got, u)
			}
		}
	})
}
