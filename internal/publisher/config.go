package publisher

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// Config is the publisher's configuration, read from the environment.
type Config struct {
	// Port is the HTTP port (PORT, default 8080).
	Port int
	// Autoscale names the autoscaled worker pool a submission wakes at zero (GENBOX_AUTOSCALE_POOL).
	Autoscale autoscale.Config
	// ShutdownGrace is how long requests in flight (event streams end at once) may finish after
	// SIGTERM (GENBOX_SHUTDOWN_GRACE, default 8s, inside Cloud Run's 10 s).
	ShutdownGrace time.Duration
	// ProjectID is the Google Cloud project of Firestore and Pub/Sub (GOOGLE_CLOUD_PROJECT).
	ProjectID string
	// AdminKey guards the admin routes (GENBOX_ADMIN_KEY); empty disables them.
	AdminKey string
	// MaxBodyBytes caps a request body (GENBOX_MAX_BODY_BYTES, default 1 MiB); more is a 413.
	MaxBodyBytes int64
	// AllowInsecureCallbacks lets callback URLs use http and private addresses, for local use
	// only (GENBOX_ALLOW_INSECURE_CALLBACKS).
	AllowInsecureCallbacks bool
	// CallbackPorts are the ports a callback URL may name (GENBOX_CALLBACK_PORTS, default
	// 443,8443; "any" admits every port). Insecure callbacks admit any port.
	CallbackPorts []uint16
	// PublicURL is the base of status_url (GENBOX_PUBLIC_URL); empty: taken from each request.
	PublicURL string
	// SecretOverlap is how long a rotated webhook secret keeps signing (GENBOX_SECRET_OVERLAP, 24h).
	SecretOverlap time.Duration
	// PromptsDir holds prompt families overriding the built-in ones (GENBOX_PROMPTS_DIR).
	PromptsDir string
	// SweepShards is the number of sweep shards new tasks are spread over (GENBOX_SWEEP_SHARDS,
	// default 1): the worker's, so each shard's leader finds them.
	SweepShards int
	// NudgeGrace is how long after a submission the sweeper nudges a task nobody claimed, in
	// case the publish after the write was lost (GENBOX_NUDGE_GRACE, default 30s).
	NudgeGrace time.Duration
	// PublishTimeout bounds the nudge after the write (GENBOX_PUBLISH_TIMEOUT, default 5s); a
	// slower Pub/Sub leaves the task to the sweeper.
	PublishTimeout time.Duration
	// StoreTimeout bounds each Firestore call a request waits on (GENBOX_STORE_TIMEOUT, default
	// 5s): a store that stalls makes the request a 503 with Retry-After, not a hang the client
	// cannot tell from a lost answer.
	StoreTimeout time.Duration
	// LimitsTTL is how long a tenant's limits are cached per instance (GENBOX_LIMITS_TTL, 30s).
	LimitsTTL time.Duration
	// TenantWaitMax is the not_before of a task submitted while its tenant's slots are all
	// taken: it is created waiting for one (GENBOX_TENANT_WAIT_MAX, default 5m, the worker's).
	TenantWaitMax time.Duration
	// SecretsKey seals the tenants' webhook secrets (GENBOX_WEBHOOK_SECRETS_KEY): a KMS
	// CryptoKey this service may encrypt with, or local:<base64> for local use.
	SecretsKey string
	// EventsPerTenant bounds a tenant's open event streams per instance
	// (GENBOX_EVENTS_PER_TENANT, default 32); past it, GET /v1/tasks/{id}/events is a 429.
	EventsPerTenant int
	// EventsHeartbeat is how often an idle event stream sends a comment line
	// (GENBOX_EVENTS_HEARTBEAT, default 15s), so proxies and clients see it alive.
	EventsHeartbeat time.Duration
	// Pricing prices a re-run's estimate as the worker prices calls (GENBOX_MODEL_CHAIN,
	// GENBOX_PRICES).
	Pricing gemini.Pricing
	// ProxyHops is how many addresses the front ends append to X-Forwarded-For
	// (GENBOX_TRUSTED_PROXY_HOPS, default 1: Cloud Run's; 2 behind an external HTTPS load
	// balancer): failed credentials are counted per client address found that far from its end.
	ProxyHops int
	// InputBucket is the Cloud Storage bucket POST /v1/uploads signs uploads into
	// (GENBOX_INPUT_BUCKET); empty: no uploads.
	InputBucket string
	// MaxFiles bounds a task's files (GENBOX_MAX_FILES, default 10); a family may allow fewer.
	MaxFiles int
	// MaxFileBytes bounds one file (the Gemini Files API's limit, 2 GiB).
	MaxFileBytes int64
	// UploadRetention is how long an upload's document is kept, and so how long a task may
	// name it: the input bucket's lifecycle rule deletes objects about then (8 days).
	UploadRetention time.Duration
}

// Environment variable names.
const (
	EnvPort                   = "PORT"
	EnvProject                = "GOOGLE_CLOUD_PROJECT"
	EnvAdminKey               = httpapi.EnvAdminKey
	EnvMaxBodyBytes           = "GENBOX_MAX_BODY_BYTES"
	EnvAllowInsecureCallbacks = "GENBOX_ALLOW_INSECURE_CALLBACKS"
	EnvCallbackPorts          = "GENBOX_CALLBACK_PORTS"
	EnvPublicURL              = "GENBOX_PUBLIC_URL"
	EnvSecretOverlap          = "GENBOX_SECRET_OVERLAP"
	EnvPromptsDir             = prompts.EnvDir
	EnvNudgeGrace             = "GENBOX_NUDGE_GRACE"
	EnvPublishTimeout         = "GENBOX_PUBLISH_TIMEOUT"
	EnvStoreTimeout           = "GENBOX_STORE_TIMEOUT"
	EnvLimitsTTL              = "GENBOX_LIMITS_TTL"
	EnvTenantWaitMax          = "GENBOX_TENANT_WAIT_MAX"
	EnvSecretsKey             = secretbox.EnvKey
	EnvEventsPerTenant        = "GENBOX_EVENTS_PER_TENANT"
	EnvEventsHeartbeat        = "GENBOX_EVENTS_HEARTBEAT"
	EnvShutdownGrace          = "GENBOX_SHUTDOWN_GRACE"
	EnvTrustedProxyHops       = authlimit.EnvTrustedProxyHops
	EnvInputBucket            = objects.EnvInputBucket
	EnvMaxFiles               = "GENBOX_MAX_FILES"
)

// DefaultConfig returns the defaults FromEnv starts from.
func DefaultConfig() Config {
	return Config{
		Port:            8080,
		ShutdownGrace:   8 * time.Second,
		MaxBodyBytes:    1 << 20,
		CallbackPorts:   ssrf.DefaultPorts,
		SecretOverlap:   24 * time.Hour,
		NudgeGrace:      30 * time.Second,
		PublishTimeout:  5 * time.Second,
		StoreTimeout:    5 * time.Second,
		LimitsTTL:       30 * time.Second,
		TenantWaitMax:   5 * time.Minute,
		EventsPerTenant: 32,
		EventsHeartbeat: 15 * time.Second,
		ProxyHops:       authlimit.DefaultTrustedHops,
		Pricing:         gemini.DefaultPricing(),
		MaxFiles:        prompts.DefaultMaxFiles,
		MaxFileBytes:    2 << 30,
		UploadRetention: 8 * 24 * time.Hour,
	}
}

// FromEnv reads the configuration; it asks getenv for every variable the publisher reads. A
// value that does not parse is an error naming its variable.
func FromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	r := envconfig.New(getenv)
	r.Port(EnvPort, &c.Port)
	r.String(EnvProject, &c.ProjectID)
	r.String(EnvAdminKey, &c.AdminKey)
	r.Int64(EnvMaxBodyBytes, &c.MaxBodyBytes)
	r.Bool(EnvAllowInsecureCallbacks, &c.AllowInsecureCallbacks)
	r.Func(EnvCallbackPorts, func(v string) (err error) {
		c.CallbackPorts, err = ssrf.ParsePorts(v)
		return err
	})
	r.String(EnvPublicURL, &c.PublicURL)
	r.Duration(EnvSecretOverlap, &c.SecretOverlap)
	r.String(EnvPromptsDir, &c.PromptsDir)
	r.Duration(EnvNudgeGrace, &c.NudgeGrace)
	r.Duration(EnvPublishTimeout, &c.PublishTimeout)
	r.Duration(EnvStoreTimeout, &c.StoreTimeout)
	r.Duration(EnvLimitsTTL, &c.LimitsTTL)
	r.Duration(EnvTenantWaitMax, &c.TenantWaitMax)
	r.String(EnvSecretsKey, &c.SecretsKey)
	r.Int(EnvEventsPerTenant, &c.EventsPerTenant)
	r.Duration(EnvEventsHeartbeat, &c.EventsHeartbeat)
	r.Duration(EnvShutdownGrace, &c.ShutdownGrace)
	r.Int(EnvTrustedProxyHops, &c.ProxyHops)
	r.String(EnvInputBucket, &c.InputBucket)
	r.Int(EnvMaxFiles, &c.MaxFiles)
	shards, err := store.ShardsFromEnv(getenv)
	c.SweepShards = shards
	pricing, perr := geminienv.Pricing(getenv)
	c.Pricing = pricing
	var aerr error
	c.Autoscale, aerr = autoscale.WakeFromEnv(getenv)
	return c, errors.Join(r.Err(), err, perr, aerr)
}

// Validate checks the configuration, naming the variable of each bad value.
func (c Config) Validate() error {
	var errs []error
	if c.ProjectID == "" {
		errs = append(errs, fmt.Errorf("%s is required", EnvProject))
	}
	if err := httpapi.CheckAdminKey(c.AdminKey); err != nil {
		errs = append(errs, err)
	}
	if c.SecretsKey == "" {
		errs = append(errs, fmt.Errorf("%s is required (the key that seals the tenants' webhook secrets)", EnvSecretsKey))
	} else if err := secretbox.CheckKey(c.SecretsKey); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", EnvSecretsKey, err))
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
	}{{EnvSecretOverlap, c.SecretOverlap}, {EnvNudgeGrace, c.NudgeGrace}, {EnvPublishTimeout, c.PublishTimeout}, {EnvStoreTimeout, c.StoreTimeout}, {EnvLimitsTTL, c.LimitsTTL}, {EnvTenantWaitMax, c.TenantWaitMax}, {EnvEventsHeartbeat, c.EventsHeartbeat}, {EnvShutdownGrace, c.ShutdownGrace}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive", d.name))
		}
	}
	if err := authlimit.CheckTrustedHops(c.ProxyHops); err != nil {
		errs = append(errs, err)
	}
	if c.MaxFiles < 0 {
		errs = append(errs, fmt.Errorf("%s: %d is negative", EnvMaxFiles, c.MaxFiles))
	}
	if c.EventsPerTenant < 1 {
		errs = append(errs, fmt.Errorf("%s: %d is below 1", EnvEventsPerTenant, c.EventsPerTenant))
	}
	return errors.Join(errs...)
}
