package dlqnotifier

import (
	"log/slog"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
)

// Settings are the dlqnotifier's configuration and the Regenerate button's pricing: what is read
// and checked before any client is opened, so that a bad value stops the start naming its
// variable.
type Settings struct {
	Config Config
	est    GeminiEstimator
}

// Load reads the configuration (FromEnv) and the estimator of its prompt families and prices.
func Load(getenv func(string) string) (Settings, error) {
	cfg, err := FromEnv(getenv)
	if err != nil {
		return Settings{}, err
	}
	est, err := cfg.Estimator()
	if err != nil {
		return Settings{}, err
	}
	return Settings{Config: cfg, est: est}, nil
}

// Prompts renders tasks' prompts with the families of GENBOX_PROMPTS_DIR, as the Regenerate
// button's estimate does (the console's re-runs use it too).
func (s Settings) Prompts() Renderer { return s.est.Prompts }

// Infra is what the caller opened for the dlqnotifier: the services/dlqnotifier process or the
// in-process dev stack.
type Infra struct {
	Store *store.Store
	// Publisher carries the decisions' nudges.
	Publisher Publisher
	Log       *slog.Logger
	// Metrics counts the task transitions decisions make; nil records none.
	Metrics *obs.Metrics
}

// Assemble builds the dlqnotifier of s over in, posting with the Slack client of its
// configuration. The caller serves its Handler and, in pull mode, runs its Run.
func Assemble(s Settings, in Infra) *Service {
	return New(s.Config, in.Store, NewSlackClient(s.Config), in.Publisher, s.est, in.Log, WithMetrics(in.Metrics))
}
