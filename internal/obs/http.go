package obs

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// Probe paths get no spans: Cloud Run calls them often and they say nothing about a task.
var probePaths = map[string]bool{"/healthz": true, "/readyz": true}

// Handler wraps h with OpenTelemetry server spans (and otelhttp's request metrics), continuing a
// trace whose traceparent arrives in the request headers. Spans are named "name METHOD /route"
// when an http.ServeMux inside h matched a pattern, else "name METHOD"; /healthz and /readyz are
// not traced. It uses the global providers and propagator, so Setup should run first.
func Handler(h http.Handler, name string) http.Handler {
	return otelhttp.NewHandler(h, name,
		otelhttp.WithFilter(func(r *http.Request) bool { return !probePaths[r.URL.Path] }),
		otelhttp.WithSpanNameFormatter(spanName))
}

func spanName(operation string, r *http.Request) string {
	if r.Pattern != "" {
		return operation + " " + r.Pattern
	}
	return operation + " " + r.Method
}
