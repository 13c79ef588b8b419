package publisher

import (
	"context"
	"log/slog"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/service"
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
	// Objects reads the files tasks name and signs uploads; nil: tasks take no files.
	Objects Objects
}

// Assembly is the publisher as a process runs it (Lifecycle): Server is served and Background
// runs beside it until it stops serving.
type Assembly struct {
	Server *Server
	// Background is the API key revocation listener (WatchKeys) and the end of the event
	// streams at shutdown (CloseStreams).
	Background []func(ctx context.Context)

	cfg   Config
	ready []obs.Check
}

// Lifecycle is the publisher as service.Run runs it, in its process and in the dev stack alike:
// the API, served to the public, with Background beside it; readiness checks Firestore.
func (a *Assembly) Lifecycle() service.Lifecycle {
	return service.Lifecycle{Handler: a.Server, Public: true, Grace: a.cfg.ShutdownGrace, Ready: a.ready,
		Background: a.Background, Started: []any{"project", a.cfg.ProjectID, "admin", a.cfg.AdminKey != ""}}
}

// Assemble builds the publisher of s over in.
func Assemble(s Settings, in Infra) (*Assembly, error) {
	srv, err := New(s.Config, Deps{Store: in.Store, Publisher: in.Publisher, Families: s.families, Log: in.Log, Metrics: in.Metrics, Objects: in.Objects})
	if err != nil {
		return nil, err
	}
	return &Assembly{Server: srv, Background: []func(context.Context){srv.WatchKeys, srv.CloseStreams},
		cfg: s.Config, ready: []obs.Check{{Name: "firestore", Probe: in.Store.Ping}}}, nil
}
