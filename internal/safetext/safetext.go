// Package safetext owns how genbox keeps text that a tenant, a receiver or a model can write:
// error messages, a receiver's answers, Slack fields. Such text is bounded before it is stored,
// logged or posted — a task is one Firestore document (1 MiB), and a document that grows past it
// can no longer be written, so the work it records would be retried forever — its URLs lose their
// query strings, fragments and userinfo (where callback tokens live), and what goes to Slack is
// escaped for mrkdwn so that it can neither ping a channel nor draw a link.
package safetext

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// MaxError bounds an error text in bytes: a task's error message and its delivery's last error,
// each delivery log entry, a dead letter's last error.
const MaxError = 512

// Ellipsis ends a text that was cut.
const Ellipsis = "…"

// Redacted replaces the query string and fragment of a URL.
const Redacted = "?REDACTED"

// Error returns s as genbox keeps an error text: URLs redacted (RedactURLs), invalid UTF-8
// replaced, at most MaxError bytes. It is idempotent.
func Error(s string) string {
	if len(s) <= MaxError && !strings.Contains(s, "://") && utf8.ValidString(s) {
		return s
	}
	// Redaction only shortens a URL or ends it in Redacted, so 4 × MaxError bytes of input are
	// plenty for MaxError of output, and a multi-megabyte text costs no more than a short one.
	return Truncate(RedactURLs(Truncate(s, 4*MaxError)), MaxError)
}

// Truncate returns s, invalid UTF-8 replaced, cut to at most n bytes on a rune boundary and
// ended with Ellipsis when it was longer.
func Truncate(s string, n int) string {
	if len(s) > n+utf8.UTFMax {
		s = s[:n+utf8.UTFMax] // the rest is cut anyway; a rune split here is replaced and cut too
	}
	s = strings.ToValidUTF8(s, string(utf8.RuneError))
	if len(s) <= n {
		return s
	}
	i := n - len(Ellipsis)
	if i < 0 {
		return ""
	}
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + Ellipsis
}

// urlPattern matches a URL inside free text: a scheme, "://" and everything up to a space, a
// quote or an angle bracket (how errors quote URLs: Post "https://…": …).
var urlPattern = regexp.MustCompile("(?i)\\b[a-z][a-z0-9+.-]*://[^\\s\"'<>`]*")

// RedactURLs strips every URL in s of its userinfo and replaces its query string and fragment
// with Redacted: callback URLs carry tokens there, and errors quote the URL they failed on.
func RedactURLs(s string) string {
	return urlPattern.ReplaceAllStringFunc(s, func(u string) string {
		scheme, rest, _ := strings.Cut(u, "://")
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndexByte(rest[:end], '@'); at >= 0 {
			rest = rest[at+1:]
		}
		if q := strings.IndexAny(rest, "?#"); q >= 0 {
			rest = rest[:q] + Redacted
		}
		return scheme + "://" + rest
	})
}

// Slack returns s escaped for Slack mrkdwn — & as &amp;, < as &lt;, > as &gt;, so it can
// neither mention (<!channel>, <@U…>) nor link (<https://…|label>) — invalid UTF-8 replaced,
// and at most n bytes, cut between escapes (never inside one) and ended with Ellipsis.
func Slack(s string, n int) string {
	s = Truncate(s, n) // escaping only lengthens: n bytes of input are enough
	out := make([]byte, 0, len(s))
	keep := -1 // the longest cut that leaves room for the ellipsis
	for _, r := range s {
		if len(out) <= n-len(Ellipsis) {
			keep = len(out)
		}
		var piece string
		switch r {
		case '&':
			piece = "&amp;"
		case '<':
			piece = "&lt;"
		case '>':
			piece = "&gt;"
		default:
			piece = string(r)
		}
		if len(out)+len(piece) > n {
			if keep < 0 {
				return ""
			}
			return string(out[:keep]) + Ellipsis
		}
		out = append(out, piece...)
	}
	return string(out)
}
