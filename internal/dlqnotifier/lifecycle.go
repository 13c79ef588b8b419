package dlqnotifier

import (
	"context"
	"net/http"

	"cloud.google.com/go/pubsub/v2"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/service"
)

// Lifecycle is the dlqnotifier as service.Run runs it, in its process and in the dev stack
// alike: its Handler, with mounts (pattern → handler, e.g. the operators' console) beside it,
// served to the public — Slack and admins call it from the internet —, and in pull mode Run of
// ps.
func (s *Service) Lifecycle(ps *pubsub.Client, mounts map[string]http.Handler) service.Lifecycle {
	mux := http.NewServeMux()
	for pattern, h := range mounts {
		mux.Handle(pattern, h)
	}
	mux.Handle("/", s.Handler())
	l := service.Lifecycle{Handler: mux, Public: true, Grace: s.cfg.ShutdownGrace,
		Ready:   []obs.Check{{Name: "firestore", Probe: s.store.Ping}},
		Started: []any{"consumer", s.cfg.Consumer, "instance", s.cfg.Instance}}
	if s.cfg.Consumer == ConsumerPull {
		l.Pull = func(ctx context.Context) error { return s.Run(ctx, ps) }
	}
	return l
}
