package publisher

import (
	"context"
	"log/slog"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// Settings are the publisher's configuration and the prompt families it accepts: what is read
// and checked before any client is opened, so that a bad value stops the start naming its
// variable.
type Settings struct {
	Config   Config
	families *prompts.Registry
}

// Load reads and validates the configuration and loads the families of GENBOX_PROMPTS_DIR.
func Load(getenv func(string) string) (Settings, error) {
	cfg, err := FromEnv(getenv)
	if err != nil {
		return Settings{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Settings{}, err
	}
	reg, err := prompts.Load(cfg.PromptsDir)
	if err != nil {
		return Settings{}, err
	}
	return Settings{Config: cfg, families: reg}, nil
}

// Infra is what the caller opened for the publisher: the services/publisher process or the
// in-process dev stack.
type Infra struct {
	Store     *store.Store
	Publisher Publisher
	Log       *slog.Logger
	// Metrics counts submitted and cancelled tasks; nil records none.
	Metrics *obs.Metrics
}

// Assembly is the publisher as a process runs it: the caller serves Server and runs Background
// beside it until it stops serving.
type Assembly struct {
	Server *Server
	// Background is the API key revocation listener (WatchKeys) and the end of the event
	// streams at shutdown (CloseStreams).
	Background []func(ctx context.Context)
}

// Assemble builds the publisher of s over in.
func Assemble(s Settings, in Infra) (*Assembly, error) {
	srv, err := New(s.Config, Deps{Store: in.Store, Publisher: in.Publisher, Families: s.families, Log: in.Log, Metrics: in.Metrics})
	if err != nil {
		return nil, err
	}
	return &Assembly{Server: srv, Background: []func(context.Context){srv.WatchKeys, srv.CloseStreams}}, nil
}
