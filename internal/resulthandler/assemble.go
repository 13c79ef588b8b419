package resulthandler

import (
	"context"
	"log/slog"
	"net/http"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/service"
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

// Assembly is the resulthandler as a process runs it (Lifecycle): in pull mode Subscription is
// pulled into Handler with Pull; in push mode PushHandler(Handler, ...) is served.
type Assembly struct {
	Handler      *Handler
	Subscription string
	// Pull holds a message while its chain of deliveries runs: a few POSTs at most.
	Pull bus.PullSettings

	cfg   Config
	log   *slog.Logger
	ready []obs.Check
}

// Lifecycle is the resulthandler as service.Run runs it, in its process and in the dev stack
// alike: in pull mode it pulls Subscription of ps into h (Handler, or a wrapper of it); in push
// mode it serves h at PushPath. Deliveries in flight get Config.ShutdownGrace to finish.
func (a *Assembly) Lifecycle(ps *pubsub.Client, h bus.Handler) service.Lifecycle {
	l := service.Lifecycle{Ready: a.ready, Grace: a.cfg.ShutdownGrace,
		Started: []any{"consumer", a.cfg.Consumer, "instance", a.cfg.Instance, "insecure_callbacks", a.cfg.AllowInsecure},
		// A push request lasts as long as its delivery: the claim, the POST and the commit.
		Limits: service.Limits{WriteTimeout: max(service.DefaultLimits().WriteTimeout, a.cfg.LeaseTTL())}}
	if a.cfg.Consumer == ConsumerPull {
		l.Pull = func(ctx context.Context) error { return bus.Pull(ctx, ps, a.Subscription, a.Pull, h) }
		return l
	}
	// Cloud Run authenticates Pub/Sub's OIDC token (the service admits only the push service
	// account, with the push audience) before a request reaches this handler, which checks it
	// again when GENBOX_PUSH_AUDIENCE and GENBOX_PUSH_SERVICE_ACCOUNT are set.
	mux := http.NewServeMux()
	mux.Handle("POST "+PushPath, PushHandler(h, a.cfg, a.log))
	l.Handler = mux
	return l
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
		cfg:          cfg,
		log:          in.Log,
		ready:        []obs.Check{{Name: "firestore", Probe: in.Store.Ping}},
	}, nil
}
