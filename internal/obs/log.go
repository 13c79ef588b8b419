package obs

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// Cloud Logging's structured-log keys (https://cloud.google.com/logging/docs/structured-logging).
const (
	KeySeverity     = "severity"
	KeyMessage      = "message"
	KeyTrace        = "logging.googleapis.com/trace"
	KeySpanID       = "logging.googleapis.com/spanId"
	KeyTraceSampled = "logging.googleapis.com/trace_sampled"
	// KeyTaskID is the attribute WithTask adds to every line logged with a task's context.
	KeyTaskID = "task_id"
)

// Redacted replaces the value of an attribute that may hold content or a secret.
const Redacted = "[redacted]"

// LogOptions tune NewLogger beyond its level.
type LogOptions struct {
	// Project is the Google Cloud project of the trace field: a line logged with a span in its
	// context links to projects/{Project}/traces/{trace id}. Empty logs the bare trace id.
	Project string
	// LogContent logs prompts, outputs, secrets and other content as they are. Off by default:
	// string or structured values of attributes named like content or secrets become Redacted.
	LogContent bool
}

// NewLogger returns a JSON logger in Cloud Logging's shape: severity (DEBUG, INFO, WARNING, ERROR),
// message and time; the trace, span id and sampling flag of the span in the record's context;
// task_id from WithTask. Attributes named like content or secrets are redacted unless
// o.LogContent is set (see sensitiveWords). Redaction goes by name: a struct logged under an
// innocent name is written whole, so log identifiers and counts, never whole requests or documents.
func NewLogger(w io.Writer, level slog.Level, o LogOptions) *slog.Logger {
	base := slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level:       level,
		ReplaceAttr: replacer(o.LogContent),
	})
	return slog.New(&handler{base: base, h: base, project: o.Project})
}

type taskKey struct{}

// WithTask returns ctx carrying taskID: every line logged with it (by a NewLogger logger, through
// the ...Context methods) has task_id, so that one task's lines can be found together.
func WithTask(ctx context.Context, taskID string) context.Context {
	return context.WithValue(ctx, taskKey{}, taskID)
}

// TaskID returns the task id WithTask put in ctx, or "".
func TaskID(ctx context.Context) string {
	id, _ := ctx.Value(taskKey{}).(string)
	return id
}

// handler adds the context's trace and task id at the top level of each line. Attributes and
// groups added by With/WithGroup are kept as ops and replayed after those top-level fields, so a
// grouped logger still writes the trace where Cloud Logging looks for it.
type handler struct {
	base    slog.Handler // the JSON handler without attributes or groups
	ops     []op         // WithAttrs/WithGroup calls, in order
	h       slog.Handler // base with ops applied
	project string
}

type op struct {
	group string
	attrs []slog.Attr
}

var _ slog.Handler = (*handler)(nil)

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.base.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	top := h.contextAttrs(ctx)
	if len(top) == 0 {
		return h.h.Handle(ctx, r)
	}
	if TaskID(ctx) == "" {
		return apply(h.base.WithAttrs(top), h.ops).Handle(ctx, r)
	}
	// The context's task_id is on the line already: drop the ones the caller added too, so the
	// line has one task_id key.
	ops := withoutTaskID(h.ops)
	if !grouped(h.ops) {
		r = recordWithoutTaskID(r)
	}
	return apply(h.base.WithAttrs(top), ops).Handle(ctx, r)
}

func grouped(ops []op) bool {
	for _, o := range ops {
		if o.group != "" {
			return true
		}
	}
	return false
}

// withoutTaskID returns ops without their top-level task_id attributes (those of groups stay).
func withoutTaskID(ops []op) []op {
	out := make([]op, 0, len(ops))
	inGroup := false
	for _, o := range ops {
		inGroup = inGroup || o.group != ""
		if inGroup {
			out = append(out, o)
			continue
		}
		attrs := make([]slog.Attr, 0, len(o.attrs))
		for _, a := range o.attrs {
			if a.Key != KeyTaskID {
				attrs = append(attrs, a)
			}
		}
		out = append(out, op{attrs: attrs})
	}
	return out
}

// recordWithoutTaskID returns r without its task_id attributes, r itself when it has none.
func recordWithoutTaskID(r slog.Record) slog.Record {
	has := false
	r.Attrs(func(a slog.Attr) bool {
		has = a.Key == KeyTaskID
		return !has
	})
	if !has {
		return r
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != KeyTaskID {
			out.AddAttrs(a)
		}
		return true
	})
	return out
}

func (h *handler) contextAttrs(ctx context.Context) []slog.Attr {
	if ctx == nil {
		return nil
	}
	var top []slog.Attr
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		tr := sc.TraceID().String()
		if h.project != "" {
			tr = "projects/" + h.project + "/traces/" + tr
		}
		//nolint:sloglint // Cloud Logging's own keys (logging.googleapis.com/trace, ...), not ours to name
		top = append(top,
			slog.String(KeyTrace, tr),
			slog.String(KeySpanID, sc.SpanID().String()),
			slog.Bool(KeyTraceSampled, sc.IsSampled()))
	}
	if id := TaskID(ctx); id != "" {
		top = append(top, slog.String(KeyTaskID, id))
	}
	return top
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return h.with(op{attrs: attrs})
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return h.with(op{group: name})
}

func (h *handler) with(o op) *handler {
	ops := append(h.ops[:len(h.ops):len(h.ops)], o)
	return &handler{base: h.base, ops: ops, h: apply(h.h, []op{o}), project: h.project}
}

func apply(h slog.Handler, ops []op) slog.Handler {
	for _, o := range ops {
		if o.group != "" {
			h = h.WithGroup(o.group)
		} else {
			h = h.WithAttrs(o.attrs)
		}
	}
	return h
}

// replacer maps slog's built-in keys to Cloud Logging's and redacts sensitive attributes.
func replacer(logContent bool) func(groups []string, a slog.Attr) slog.Attr {
	return func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 {
			switch a.Key {
			case slog.LevelKey:
				if l, ok := a.Value.Any().(slog.Level); ok {
					return slog.String(KeySeverity, severity(l))
				}
			case slog.MessageKey:
				if a.Value.Kind() == slog.KindString {
					return slog.String(KeyMessage, a.Value.String())
				}
			}
		}
		if logContent || !mayHoldContent(a.Value) {
			return a
		}
		if sensitive(a.Key) || sensitiveGroup(groups) {
			return slog.String(a.Key, Redacted)
		}
		return a
	}
}

// severity maps a slog level to Cloud Logging's LogSeverity names.
func severity(l slog.Level) string {
	switch {
	case l < slog.LevelInfo:
		return "DEBUG"
	case l < slog.LevelWarn:
		return "INFO"
	case l < slog.LevelError:
		return "WARNING"
	default:
		return "ERROR"
	}
}

// mayHoldContent reports whether v could carry text: numbers, booleans, durations and times
// cannot, which keeps counts such as prompt_tokens and output_tokens in the logs.
func mayHoldContent(v slog.Value) bool {
	switch v.Kind() {
	case slog.KindInt64, slog.KindUint64, slog.KindFloat64, slog.KindBool, slog.KindDuration, slog.KindTime:
		return false
	}
	return true
}

// sensitiveWords are the name parts of attributes that may hold model content (prompts, outputs,
// payloads) or secrets. A key matches when one of its parts (split at _ - . / and case changes),
// singular, is in the set, or two adjacent parts are "api" and "key".
var sensitiveWords = map[string]bool{
	"prompt": true, "input": true, "output": true, "text": true, "content": true,
	"instruction": true, "body": true, "payload": true,
	"secret": true, "token": true, "apikey": true, "authorization": true, "signature": true,
	"password": true, "credential": true,
}

func sensitive(key string) bool {
	parts := words(key)
	for i, p := range parts {
		if sensitiveWords[strings.TrimSuffix(p, "s")] || sensitiveWords[p] {
			return true
		}
		if p == "api" && i+1 < len(parts) && parts[i+1] == "key" {
			return true
		}
	}
	return false
}

func sensitiveGroup(groups []string) bool {
	for _, g := range groups {
		if sensitive(g) {
			return true
		}
	}
	return false
}

// words splits key into lower-case parts at separators and lower-to-upper case changes.
func words(key string) []string {
	var parts []string
	var b strings.Builder
	flush := func() {
		if b.Len() > 0 {
			parts = append(parts, b.String())
			b.Reset()
		}
	}
	prevLower := false
	for _, r := range key {
		switch {
		case r == '_' || r == '-' || r == '.' || r == '/' || r == ' ':
			flush()
			prevLower = false
			continue
		case r >= 'A' && r <= 'Z':
			if prevLower {
				flush()
			}
			b.WriteRune(r + ('a' - 'A'))
			prevLower = false
			continue
		}
		b.WriteRune(r)
		prevLower = r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
	}
	flush()
	return parts
}
