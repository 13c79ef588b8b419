package resulthandler

import (
	"log/slog"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
)

// Infra is what the caller opened for the resulthandler: the services/resulthandler process or
// the in-process dev stack.
type Infra struct {
	// Store holds the tasks and the tenants' webhook secrets.
	Store *store.Store
	// Publisher carries the DLQ notices.
	Publisher Publisher
	Log       *slog.Logger
	// Metrics records the webhook attempts and retries; nil records none.
	Metrics *obs.Metrics
}

// Assembly is the resulthandler as a process runs it: in pull mode the caller pulls Subscription
// into Handler with Pull; in push mode it serves PushHandler(Handler, ...).
type Assembly struct {
	Handler      *Handler
	Subscription string
	// Pull holds a message while its chain of deliveries runs: a few POSTs at most.
	Pull bus.PullSettings
}

// Assemble builds the resulthandler of cfg over in, delivering through the SSRF-guarded client
// of cfg's callback policy.
func Assemble(cfg Config, in Infra) (*Assembly, error) {
	h, err := New(in.Store, NewSecretsCache(in.Store, cfg.TenantRefresh), in.Publisher, ssrf.NewClient(cfg.SSRF()), in.Log, cfg.Policy, WithMetrics(in.Metrics))
	if err != nil {
		return nil, err
	}
	return &Assembly{
		Handler:      h,
		Subscription: cfg.Subscription,
		Pull:         bus.PullSettings{MaxOutstandingMessages: cfg.Concurrency, MaxExtension: 10 * cfg.LeaseTTL()},
	}, nil
}
