package resulthandler

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
)

// Environment variables the resulthandler reads (besides the telemetry ones of internal/obs).
const (
	EnvProject        = "GOOGLE_CLOUD_PROJECT"
	EnvPort           = "PORT"
	EnvInstance       = "GENBOX_INSTANCE_ID"
	EnvSubscription   = "GENBOX_RESULTS_SUBSCRIPTION"
	EnvConsumer       = "GENBOX_CONSUMER"
	EnvConcurrency    = "GENBOX_CONCURRENCY"
	EnvTimeout        = "GENBOX_WEBHOOK_TIMEOUT"
	EnvTenantRefresh  = "GENBOX_TENANT_REFRESH"
	EnvHorizon        = "GENBOX_DELIVERY_HORIZON"
	EnvBackoffMin     = "GENBOX_DELIVERY_BACKOFF_MIN"
	EnvBackoffMax     = "GENBOX_DELIVERY_BACKOFF_MAX"
	EnvNoticeGrace    = "GENBOX_NOTICE_GRACE"
	EnvAllowInsecure  = "GENBOX_ALLOW_INSECURE_CALLBACKS"
	EnvShutdownGrace  = "GENBOX_SHUTDOWN_GRACE"
	EnvPushAudience   = "GENBOX_PUSH_AUDIENCE"
	EnvPushAccount    = "GENBOX_PUSH_SERVICE_ACCOUNT"
	EnvUnauthPush     = bus.EnvUnauthenticatedPush
	EnvSecretsKey     = secretbox.EnvKey
	defaultPort       = 8080
	defaultLogEntries = 20
)

// Consumer modes of GENBOX_CONSUMER.
const (
	ConsumerPush = "push" // Pub/Sub pushes to PushPath (Cloud Run, request-driven)
	ConsumerPull = "pull" // streaming pull (an always-on instance, or `genbox dev`)
)

// PushPath is where the push consumer is mounted: the push endpoint of the subscription.
const PushPath = "/pubsub/push"

// ErrConfig means a setting is invalid; the message names the variable.
var ErrConfig = errors.New("resulthandler: invalid configuration")

// Config is the resulthandler's configuration, read from the environment.
type Config struct {
	Project      string // GOOGLE_CLOUD_PROJECT
	Port         int    // PORT: /healthz and, in push mode, the push endpoint
	Instance     string // GENBOX_INSTANCE_ID: the delivery lease owner (hostname-pid when empty)
	Subscription string // GENBOX_RESULTS_SUBSCRIPTION (pull mode)
	Consumer     string // GENBOX_CONSUMER: push (Cloud Run request-driven) or pull
	Concurrency  int    // GENBOX_CONCURRENCY: messages handled at once in pull mode
	SweepShards  int    // GENBOX_SWEEP_SHARDS: the sweep shards the tasks it writes are spread over

	// The push route admits only OIDC tokens for PushAudience (GENBOX_PUSH_AUDIENCE) signed for
	// PushAccount (GENBOX_PUSH_SERVICE_ACCOUNT): a second check behind Cloud Run's, which already
	// admits only that account on the private service. Both are required in push mode unless
	// UnauthenticatedPush (GENBOX_UNAUTHENTICATED_PUSH, local use only) turns the check off.
	PushAudience, PushAccount string
	UnauthenticatedPush       bool

	Policy

	// SecretsKey opens the tenants' webhook secrets (GENBOX_WEBHOOK_SECRETS_KEY): a KMS CryptoKey
	// this service may decrypt with, or local:<base64> for local use.
	SecretsKey string

	// AllowInsecure admits http callbacks and loopback receivers: local use only.
	AllowInsecure bool          // GENBOX_ALLOW_INSECURE_CALLBACKS
	ShutdownGrace time.Duration // GENBOX_SHUTDOWN_GRACE: in-flight deliveries may finish within it
	// TenantRefresh is how long a tenant's webhook secrets, once read, sign its deliveries
	// (GENBOX_TENANT_REFRESH): a rotation or revocation is applied within it.
	TenantRefresh time.Duration
}

// Policy is what the Handler needs of the configuration.
type Policy struct {
	Owner       string        // the delivery lease owner
	Timeout     time.Duration // GENBOX_WEBHOOK_TIMEOUT: one POST, response included
	Horizon     time.Duration // GENBOX_DELIVERY_HORIZON: retries stop this long after the first attempt
	BackoffMin  time.Duration // GENBOX_DELIVERY_BACKOFF_MIN: the smallest delay before a retry
	BackoffMax  time.Duration // GENBOX_DELIVERY_BACKOFF_MAX: the ceiling of the exponential backoff
	NoticeGrace time.Duration // GENBOX_NOTICE_GRACE: the sweeper re-sends a DLQ notice after it
	LogEntries  int           // attempts kept in delivery.log
}

// DefaultPolicy returns the production delivery policy for owner.
func DefaultPolicy(owner string) Policy {
	return Policy{
		Owner:       owner,
		Timeout:     ssrf.DefaultTimeout,
		Horizon:     24 * time.Hour,
		BackoffMin:  10 * time.Second,
		BackoffMax:  time.Hour,
		NoticeGrace: time.Minute,
		LogEntries:  defaultLogEntries,
	}
}

// LeaseTTL is how long a delivery claim lasts: protocol.DeliveryLease of the timeout, as long as the
// worker's reservation.
func (p Policy) LeaseTTL() time.Duration { return protocol.DeliveryLease(p.Timeout) }

// SSRF returns the delivery client's policy.
func (c Config) SSRF() ssrf.Policy {
	return ssrf.Policy{AllowHTTP: c.AllowInsecure, AllowLoopback: c.AllowInsecure, Timeout: c.Timeout}
}

// FromEnv reads the configuration, with defaults, calling getenv for every variable it knows,
// and validates it.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Port:          defaultPort,
		Subscription:  bus.SubResults,
		Consumer:      ConsumerPush,
		Concurrency:   64,
		ShutdownGrace: 8 * time.Second,
		TenantRefresh: 10 * time.Second,
	}
	r := envconfig.New(getenv)
	r.String(EnvProject, &c.Project)
	r.Port(EnvPort, &c.Port)
	r.String(EnvInstance, &c.Instance)
	r.String(EnvSubscription, &c.Subscription)
	r.String(EnvConsumer, &c.Consumer)
	r.String(EnvPushAudience, &c.PushAudience)
	r.String(EnvPushAccount, &c.PushAccount)
	r.Bool(EnvUnauthPush, &c.UnauthenticatedPush)
	r.String(EnvSecretsKey, &c.SecretsKey)
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = host + "-" + strconv.Itoa(os.Getpid())
	}
	c.Policy = DefaultPolicy(c.Instance)
	r.Duration(EnvTimeout, &c.Timeout)
	r.Duration(EnvHorizon, &c.Horizon)
	r.Duration(EnvBackoffMin, &c.BackoffMin)
	r.Duration(EnvBackoffMax, &c.BackoffMax)
	r.Duration(EnvNoticeGrace, &c.NoticeGrace)
	r.Duration(EnvShutdownGrace, &c.ShutdownGrace)
	r.Duration(EnvTenantRefresh, &c.TenantRefresh)
	r.Int(EnvConcurrency, &c.Concurrency)
	r.Bool(EnvAllowInsecure, &c.AllowInsecure)
	shards, err := store.ShardsFromEnv(getenv)
	c.SweepShards = shards
	if err := errors.Join(r.Err(), err); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, c.Validate()
}

// Validate reports every setting that cannot work, naming its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, name, why)) }
	if c.Project == "" {
		bad(EnvProject, "is required")
	}
	if c.Consumer != ConsumerPush && c.Consumer != ConsumerPull {
		bad(EnvConsumer, "must be push or pull")
	}
	for _, v := range []struct{ name, value, other, otherName string }{
		{EnvPushAudience, c.PushAudience, c.PushAccount, EnvPushAccount}, {EnvPushAccount, c.PushAccount, c.PushAudience, EnvPushAudience},
	} {
		switch {
		case v.value != "":
		case v.other != "":
			bad(v.name, "is required with "+v.otherName)
		case c.Consumer == ConsumerPush && !c.UnauthenticatedPush:
			bad(v.name, "is required in push mode (the push route verifies every request; "+EnvUnauthPush+"=1 turns that off, for local use only)")
		}
	}
	if c.Concurrency <= 0 {
		bad(EnvConcurrency, "must be positive")
	}
	if c.SecretsKey == "" {
		bad(EnvSecretsKey, "is required (the key that opens the tenants' webhook secrets)")
	} else if err := secretbox.CheckKey(c.SecretsKey); err != nil {
		bad(EnvSecretsKey, err.Error())
	}
	if c.TenantRefresh <= 0 {
		bad(EnvTenantRefresh, "must be positive")
	}
	if c.ShutdownGrace <= 0 {
		bad(EnvShutdownGrace, "must be positive")
	}
	if err := c.Policy.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p Policy) validate() error {
	var errs []error
	bad := func(name, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, name, why)) }
	if p.Owner == "" {
		bad(EnvInstance, "must not be empty")
	}
	if p.Timeout <= 0 {
		bad(EnvTimeout, "must be positive")
	}
	if p.Horizon <= 0 {
		bad(EnvHorizon, "must be positive")
	}
	if p.BackoffMin <= 0 {
		bad(EnvBackoffMin, "must be positive")
	}
	if p.BackoffMax < p.BackoffMin {
		bad(EnvBackoffMax, "must not be below "+EnvBackoffMin)
	}
	if p.NoticeGrace <= 0 {
		bad(EnvNoticeGrace, "must be positive")
	}
	if p.LogEntries <= 0 {
		errs = append(errs, fmt.Errorf("%w: LogEntries must be positive", ErrConfig))
	}
	return errors.Join(errs...)
}
