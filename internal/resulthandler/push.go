package resulthandler

import (
	"log/slog"
	"net/http"

	"github.com/genbox-dev/genbox/internal/bus"
)

// PushAuth is what the push route admits; it verifies nothing unless both variables are set.
func (c Config) PushAuth() bus.PushAuth {
	return bus.PushAuth{Audience: c.PushAudience, ServiceAccount: c.PushAccount}
}

// PushHandler is the handler of PushPath: Pub/Sub push envelopes for h, admitted only with a
// valid OIDC token of the push service account; without push authentication every request is
// refused, unless c.UnauthenticatedPush says this is local use.
func PushHandler(h bus.Handler, c Config, log *slog.Logger) http.Handler {
	return bus.PushRoute(h, c.PushAuth(), c.UnauthenticatedPush, log)
}
