package obs

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// Handler wraps h with OpenTelemetry server spans (and otelhttp's request metrics) named name,
// continuing a trace whose traceparent arrives in the request headers. It uses the global
// providers and propagator, so call it after Setup.
func Handler(h http.Handler, name string) http.Handler {
	return otelhttp.NewHandler(h, name)
}
