package dlqnotifier

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// Environment variables the dlqnotifier reads (besides the telemetry ones of internal/obs).
const (
	EnvPort             = "PORT"
	EnvProject          = "GOOGLE_CLOUD_PROJECT"
	EnvBotToken         = "SLACK_BOT_TOKEN"
	EnvSigningSecret    = "SLACK_SIGNING_SECRET"
	EnvChannel          = "GENBOX_SLACK_CHANNEL"
	EnvApprovers        = "GENBOX_SLACK_APPROVERS"
	EnvSlackAPIURL      = "GENBOX_SLACK_API_URL"
	EnvAdminKey         = httpapi.EnvAdminKey
	EnvAlertCooldown    = "GENBOX_ALERT_COOLDOWN"
	EnvConsumer         = "GENBOX_CONSUMER"
	EnvInstance         = "GENBOX_INSTANCE_ID"
	EnvTasksDLQSub      = "GENBOX_TASKS_DLQ_SUBSCRIPTION"
	EnvResultsDLQSub    = "GENBOX_RESULTS_DLQ_SUBSCRIPTION"
	EnvAlertsSub        = "GENBOX_ALERTS_SUBSCRIPTION"
	EnvPostLease        = "GENBOX_SLACK_POST_LEASE"
	EnvPostBackoffBase  = "GENBOX_SLACK_BACKOFF_BASE"
	EnvPostBackoffMax   = "GENBOX_SLACK_BACKOFF_MAX"
	EnvFollowUpGrace    = "GENBOX_DECISION_GRACE"
	EnvFloodWindow      = "GENBOX_SLACK_FLOOD_WINDOW"
	EnvShutdownGrace    = "GENBOX_SHUTDOWN_GRACE"
	EnvPushAudience     = "GENBOX_PUSH_AUDIENCE"
	EnvPushAccount      = "GENBOX_PUSH_SERVICE_ACCOUNT"
	EnvUnauthPush       = bus.EnvUnauthenticatedPush
	EnvPromptsDir       = prompts.EnvDir
	EnvTrustedProxyHops = authlimit.EnvTrustedProxyHops
	ConsumerPush        = "push"
	ConsumerPull        = "pull"
	defaultPort         = 8080
	defaultSlackAPIBase = "https://slack.com"
)

// Routes of the service's HTTP handler.
const (
	InteractionsPath = "/slack/interactions"
	PushPath         = "/pubsub/push"
	AdminPrefix      = "/admin/dead-letters"
)

// ErrConfig means a setting is invalid; the message names the variable.
var ErrConfig = errors.New("dlqnotifier: invalid configuration")

// Config is the dlqnotifier's configuration, read from the environment.
type Config struct {
	// Autoscale names the autoscaled worker pool a Regenerate wakes at zero (GENBOX_AUTOSCALE_POOL).
	Autoscale     autoscale.Config
	Port          int      // PORT
	Project       string   // GOOGLE_CLOUD_PROJECT
	BotToken      string   // SLACK_BOT_TOKEN: chat.postMessage, chat.update, chat.postEphemeral
	SigningSecret string   // SLACK_SIGNING_SECRET: verifies /slack/interactions
	Channel       string   // GENBOX_SLACK_CHANNEL: where dead letters and alerts are posted
	Approvers     []string // GENBOX_SLACK_APPROVERS: comma-separated Slack user ids who may decide
	SlackAPIURL   string   // GENBOX_SLACK_API_URL: Slack's base URL, https://slack.com (a local double in dev)
	SweepShards   int      // GENBOX_SWEEP_SHARDS: the sweep shards the tasks it writes are spread over
	AdminKey      string   // GENBOX_ADMIN_KEY: Bearer key of /admin/...; empty disables the admin path
	Consumer      string   // GENBOX_CONSUMER: push (Cloud Run) or pull
	Instance      string   // GENBOX_INSTANCE_ID: the post lease owner (hostname-pid when empty)
	// ProxyHops is how many addresses the front ends append to X-Forwarded-For
	// (GENBOX_TRUSTED_PROXY_HOPS, default 1: Cloud Run's; 2 behind an external HTTPS load
	// balancer, as with IAP in front of the console): failed credentials are counted per client
	// address found that far from its end.
	ProxyHops int

	// Pull subscriptions (GENBOX_TASKS_DLQ_SUBSCRIPTION, GENBOX_RESULTS_DLQ_SUBSCRIPTION,
	// GENBOX_ALERTS_SUBSCRIPTION).
	TasksDLQSub, ResultsDLQSub, AlertsSub string

	// The service is public (Slack must reach it), so Cloud Run does not check push tokens: the
	// push route admits only OIDC tokens for PushAudience (GENBOX_PUSH_AUDIENCE, the push
	// subscriptions' oidc_token.audience) signed for PushAccount (GENBOX_PUSH_SERVICE_ACCOUNT).
	// Both are required in push mode; without them the push route refuses every request, unless
	// UnauthenticatedPush (GENBOX_UNAUTHENTICATED_PUSH: genbox dev and tests only) turns the
	// check off.
	PushAudience, PushAccount string
	UnauthenticatedPush       bool

	// The Regenerate button prices a task as the worker's max_cost_usd check does: its prompt
	// rendered with the families of PromptsDir (GENBOX_PROMPTS_DIR, as the publisher and worker
	// load them), priced with the worker's chain and prices (GENBOX_MODEL_CHAIN, GENBOX_PRICES).
	PromptsDir string
	Pricing    gemini.Pricing

	Policy

	ShutdownGrace time.Duration // GENBOX_SHUTDOWN_GRACE
}

// Policy is the timing the service needs.
type Policy struct {
	AlertCooldown   time.Duration // GENBOX_ALERT_COOLDOWN: one post per alert key within it
	PostLease       time.Duration // GENBOX_SLACK_POST_LEASE: a notice is held this long while posted
	PostBackoffBase time.Duration // GENBOX_SLACK_BACKOFF_BASE: the first delay after a failed Slack call
	PostBackoffMax  time.Duration // GENBOX_SLACK_BACKOFF_MAX: the cap of that backoff
	// FollowUpGrace holds the sweeper off a decision's nudges and Slack update while this
	// process carries them itself (GENBOX_DECISION_GRACE).
	FollowUpGrace time.Duration
	// FloodWindow groups a tenant's delivery dead letters of one receiver refusal: the first of a
	// window gets its own message, the others one message updated with their count
	// (GENBOX_SLACK_FLOOD_WINDOW).
	FloodWindow time.Duration
}

// DefaultPolicy returns the production timing.
func DefaultPolicy() Policy {
	return Policy{
		AlertCooldown: 30 * time.Minute, PostLease: 30 * time.Second,
		PostBackoffBase: 10 * time.Second, PostBackoffMax: 10 * time.Minute, FollowUpGrace: time.Minute,
		FloodWindow: time.Hour,
	}
}

// FromEnv reads the configuration with defaults, calling getenv for every variable it knows, and
// validates it.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Port: defaultPort, Consumer: ConsumerPush, SlackAPIURL: defaultSlackAPIBase,
		TasksDLQSub: bus.SubTasksDLQ, ResultsDLQSub: bus.SubResultsDLQ, AlertsSub: bus.SubAlerts,
		Policy: DefaultPolicy(), ShutdownGrace: 8 * time.Second, ProxyHops: authlimit.DefaultTrustedHops,
	}
	r := envconfig.New(getenv)
	r.Port(EnvPort, &c.Port)
	r.String(EnvProject, &c.Project)
	r.String(EnvBotToken, &c.BotToken)
	r.String(EnvSigningSecret, &c.SigningSecret)
	r.String(EnvChannel, &c.Channel)
	r.List(EnvApprovers, &c.Approvers)
	r.String(EnvSlackAPIURL, &c.SlackAPIURL)
	r.String(EnvAdminKey, &c.AdminKey)
	r.String(EnvConsumer, &c.Consumer)
	r.String(EnvInstance, &c.Instance)
	r.String(EnvTasksDLQSub, &c.TasksDLQSub)
	r.String(EnvResultsDLQSub, &c.ResultsDLQSub)
	r.String(EnvAlertsSub, &c.AlertsSub)
	r.String(EnvPushAudience, &c.PushAudience)
	r.String(EnvPushAccount, &c.PushAccount)
	r.Bool(EnvUnauthPush, &c.UnauthenticatedPush)
	r.String(EnvPromptsDir, &c.PromptsDir)
	r.Int(EnvTrustedProxyHops, &c.ProxyHops)
	c.SlackAPIURL = strings.TrimRight(c.SlackAPIURL, "/")
	if c.SlackAPIURL == "" {
		c.SlackAPIURL = defaultSlackAPIBase
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = host + "-" + strconv.Itoa(os.Getpid())
	}
	r.Duration(EnvAlertCooldown, &c.AlertCooldown)
	r.Duration(EnvPostLease, &c.PostLease)
	r.Duration(EnvPostBackoffBase, &c.PostBackoffBase)
	r.Duration(EnvPostBackoffMax, &c.PostBackoffMax)
	r.Duration(EnvFollowUpGrace, &c.FollowUpGrace)
	r.Duration(EnvFloodWindow, &c.FloodWindow)
	r.Duration(EnvShutdownGrace, &c.ShutdownGrace)
	var errs []error
	if err := r.Err(); err != nil {
		errs = append(errs, err)
	}
	var err error
	if c.Pricing, err = geminienv.Pricing(getenv); err != nil {
		errs = append(errs, err)
	}
	if c.SweepShards, err = store.ShardsFromEnv(getenv); err != nil {
		errs = append(errs, err)
	}
	if c.Autoscale, err = autoscale.WakeFromEnv(getenv); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, c.Validate()
}

// Estimator returns the Regenerate button's pricing (GeminiEstimator): the task's prompt rendered
// with the families of GENBOX_PROMPTS_DIR and priced with c.Pricing, no model call. A directory
// that does not load is an error naming the variable.
func (c Config) Estimator() (GeminiEstimator, error) {
	reg, err := prompts.Load(c.PromptsDir)
	if err != nil {
		return GeminiEstimator{}, err
	}
	return GeminiEstimator{Pricer: c.Pricing, Prompts: reg}, nil
}

// PushAuth is what the push route admits: tokens of PushAccount for PushAudience.
func (c Config) PushAuth() bus.PushAuth {
	return bus.PushAuth{Audience: c.PushAudience, ServiceAccount: c.PushAccount}
}

// Validate reports every setting that cannot work, naming its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, name, why)) }
	if c.Project == "" {
		bad(EnvProject, "is required")
	}
	if c.BotToken == "" {
		bad(EnvBotToken, "is required")
	}
	if c.SigningSecret == "" {
		bad(EnvSigningSecret, "is required")
	}
	if c.Channel == "" {
		bad(EnvChannel, "is required")
	}
	if len(c.Approvers) == 0 {
		bad(EnvApprovers, "must name at least one Slack user id")
	}
	if u, err := url.Parse(c.SlackAPIURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		bad(EnvSlackAPIURL, "must be an http(s) URL")
	}
	if c.Consumer != ConsumerPush && c.Consumer != ConsumerPull {
		bad(EnvConsumer, "must be push or pull")
	}
	if err := httpapi.CheckAdminKey(c.AdminKey); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	if err := authlimit.CheckTrustedHops(c.ProxyHops); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	for _, v := range []struct{ name, value, other string }{
		{EnvPushAudience, c.PushAudience, c.PushAccount}, {EnvPushAccount, c.PushAccount, c.PushAudience},
	} {
		switch {
		case v.value != "":
		case v.other != "":
			bad(v.name, "is required with the other push authentication variable")
		case c.Consumer == ConsumerPush && !c.UnauthenticatedPush:
			bad(v.name, "is required in push mode (the public service verifies push tokens; "+EnvUnauthPush+"=1 turns that off, for local use only)")
		}
	}
	for _, v := range []struct {
		name string
		d    time.Duration
	}{
		{EnvAlertCooldown, c.AlertCooldown}, {EnvPostLease, c.PostLease}, {EnvPostBackoffBase, c.PostBackoffBase},
		{EnvFollowUpGrace, c.FollowUpGrace}, {EnvFloodWindow, c.FloodWindow}, {EnvShutdownGrace, c.ShutdownGrace},
	} {
		if v.d <= 0 {
			bad(v.name, "must be positive")
		}
	}
	if c.PostBackoffMax < c.PostBackoffBase {
		bad(EnvPostBackoffMax, "must be at least "+EnvPostBackoffBase)
	}
	return errors.Join(errs...)
}
