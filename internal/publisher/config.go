package publisher

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// Config is the publisher's configuration, read from the environment.
type Config struct {
	// Port is the HTTP port (PORT, default 8080).
	Port int
	// ProjectID is the Google Cloud project of Firestore and Pub/Sub (GOOGLE_CLOUD_PROJECT).
	ProjectID string
	// AdminKey guards the admin routes (GENBOX_ADMIN_KEY); empty disables them.
	AdminKey string
	// MaxBodyBytes caps a request body (GENBOX_MAX_BODY_BYTES, default 1 MiB); more is a 413.
	MaxBodyBytes int64
	// AllowInsecureCallbacks lets callback URLs use http and private addresses, for local use
	// only (GENBOX_ALLOW_INSECURE_CALLBACKS).
	AllowInsecureCallbacks bool
	// PublicURL is the base of status_url (GENBOX_PUBLIC_URL); empty: taken from each request.
	PublicURL string
	// SecretOverlap is how long a rotated webhook secret keeps signing (GENBOX_SECRET_OVERLAP, 24h).
	SecretOverlap time.Duration
	// PromptsDir holds prompt families overriding the built-in ones (GENBOX_PROMPTS_DIR).
	PromptsDir string
	// NudgeGrace is how long after a submission the sweeper nudges a task nobody claimed, in
	// case the publish after the write was lost (GENBOX_NUDGE_GRACE, default 30s).
	NudgeGrace time.Duration
	// PublishTimeout bounds the nudge after the write (GENBOX_PUBLISH_TIMEOUT, default 5s); a
	// slower Pub/Sub leaves the task to the sweeper.
	PublishTimeout time.Duration
	// LimitsTTL is how long a tenant's limits are cached per instance (GENBOX_LIMITS_TTL, 30s).
	LimitsTTL time.Duration
	// EventsPerTenant bounds a tenant's open event streams per instance
	// (GENBOX_EVENTS_PER_TENANT, default 32); past it, GET /v1/tasks/{id}/events is a 429.
	EventsPerTenant int
	// EventsHeartbeat is how often an idle event stream sends a comment line
	// (GENBOX_EVENTS_HEARTBEAT, default 15s), so proxies and clients see it alive.
	EventsHeartbeat time.Duration
}

// Environment variable names.
const (
	EnvPort                   = "PORT"
	EnvProject                = "GOOGLE_CLOUD_PROJECT"
	EnvAdminKey               = "GENBOX_ADMIN_KEY"
	EnvMaxBodyBytes           = "GENBOX_MAX_BODY_BYTES"
	EnvAllowInsecureCallbacks = "GENBOX_ALLOW_INSECURE_CALLBACKS"
	EnvPublicURL              = "GENBOX_PUBLIC_URL"
	EnvSecretOverlap          = "GENBOX_SECRET_OVERLAP"
	EnvPromptsDir             = prompts.EnvDir
	EnvNudgeGrace             = "GENBOX_NUDGE_GRACE"
	EnvPublishTimeout         = "GENBOX_PUBLISH_TIMEOUT"
	EnvLimitsTTL              = "GENBOX_LIMITS_TTL"
	EnvEventsPerTenant        = "GENBOX_EVENTS_PER_TENANT"
	EnvEventsHeartbeat        = "GENBOX_EVENTS_HEARTBEAT"
)

// DefaultConfig returns the defaults FromEnv starts from.
func DefaultConfig() Config {
	return Config{
		Port:            8080,
		MaxBodyBytes:    1 << 20,
		SecretOverlap:   24 * time.Hour,
		NudgeGrace:      30 * time.Second,
		PublishTimeout:  5 * time.Second,
		LimitsTTL:       30 * time.Second,
		EventsPerTenant: 32,
		EventsHeartbeat: 15 * time.Second,
	}
}

// FromEnv reads the configuration; it asks getenv for every variable the publisher reads. A
// value that does not parse is an error naming its variable.
func FromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	r := envconfig.New(getenv)
	r.Int(EnvPort, &c.Port)
	r.String(EnvProject, &c.ProjectID)
	r.String(EnvAdminKey, &c.AdminKey)
	r.Int64(EnvMaxBodyBytes, &c.MaxBodyBytes)
	r.Bool(EnvAllowInsecureCallbacks, &c.AllowInsecureCallbacks)
	r.String(EnvPublicURL, &c.PublicURL)
	r.Duration(EnvSecretOverlap, &c.SecretOverlap)
	r.String(EnvPromptsDir, &c.PromptsDir)
	r.Duration(EnvNudgeGrace, &c.NudgeGrace)
	r.Duration(EnvPublishTimeout, &c.PublishTimeout)
	r.Duration(EnvLimitsTTL, &c.LimitsTTL)
	r.Int(EnvEventsPerTenant, &c.EventsPerTenant)
	r.Duration(EnvEventsHeartbeat, &c.EventsHeartbeat)
	return c, r.Err()
}

// minAdminKey is the shortest admin key accepted: it guards every tenant.
const minAdminKey = 16

// Validate checks the configuration, naming the variable of each bad value.
func (c Config) Validate() error {
	var errs []error
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("%s: %d is not a port", EnvPort, c.Port))
	}
	if c.ProjectID == "" {
		errs = append(errs, fmt.Errorf("%s is required", EnvProject))
	}
	if c.AdminKey != "" && len(c.AdminKey) < minAdminKey {
		errs = append(errs, fmt.Errorf("%s: must be at least %d characters", EnvAdminKey, minAdminKey))
	}
	if c.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("%s: %d is below 1024", EnvMaxBodyBytes, c.MaxBodyBytes))
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s: %q is not an absolute http(s) URL", EnvPublicURL, c.PublicURL))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{EnvSecretOverlap, c.SecretOverlap}, {EnvNudgeGrace, c.NudgeGrace}, {EnvPublishTimeout, c.PublishTimeout}, {EnvLimitsTTL, c.LimitsTTL}, {EnvEventsHeartbeat, c.EventsHeartbeat}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive", d.name))
		}
	}
	if c.EventsPerTenant < 1 {
		errs = append(errs, fmt.Errorf("%s: %d is below 1", EnvEventsPerTenant, c.EventsPerTenant))
	}
	return errors.Join(errs...)
}
