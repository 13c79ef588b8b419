package obs

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/baggage"
)

// Probe paths get no spans: Cloud Run calls them often and they say nothing about a task.
var probePaths = map[string]bool{"/healthz": true, "/readyz": true}

// Handler wraps h with OpenTelemetry server spans (and otelhttp's request metrics), continuing a
// trace whose traceparent arrives in the request headers: for a service only genbox and Google
// call. Spans are named "name METHOD /route" when an http.ServeMux inside h matched a pattern,
// else "name METHOD"; /healthz and /readyz are not traced. It uses the global providers and
// propagator, so Setup should run first.
func Handler(h http.Handler, name string) http.Handler {
	return otelhttp.NewHandler(h, name, handlerOptions()...)
}

// PublicHandler is Handler for a service the internet calls: a request's trace headers are the
// caller's to choose, so its span starts a new trace linked to the caller's (which may not
// decide genbox's sampling or make its spans part of someone else's trace), and the caller's
// baggage is dropped before h sees the request.
func PublicHandler(h http.Handler, name string) http.Handler {
	noBaggage := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(baggage.ContextWithoutBaggage(r.Context())))
	})
	return otelhttp.NewHandler(noBaggage, name, append(handlerOptions(), otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }))...)
}

func handlerOptions() []otelhttp.Option {
	return []otelhttp.Option{
		otelhttp.WithFilter(func(r *http.Request) bool { return !probePaths[r.URL.Path] }),
		otelhttp.WithSpanNameFormatter(spanName),
	}
}

func spanName(operation string, r *http.Request) string {
	if r.Pattern != "" {
		return operation + " " + r.Pattern
	}
	return operation + " " + r.Method
}
