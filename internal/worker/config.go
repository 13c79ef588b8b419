package worker

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/batcher"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/envconfig"
	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/sweeper"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
)

// Config is the worker service's configuration, read from the environment.
type Config struct {
	Project      string // GOOGLE_CLOUD_PROJECT
	Port         int    // PORT: /healthz
	Instance     string // GENBOX_INSTANCE_ID: the lease owner name (hostname-pid when empty)
	Subscription string // GENBOX_TASKS_SUBSCRIPTION
	PromptsDir   string // GENBOX_PROMPTS_DIR: family files over the built-in ones (prompts.Load), as the publisher's
	// InputBucket (GENBOX_INPUT_BUCKET) is the publisher's upload bucket: when set, the worker
	// opens Cloud Storage and runs tasks with files (any bucket its account may read).
	InputBucket string

	LeaseTTL     time.Duration // GENBOX_LEASE_TTL: how long a claim lasts without renewal
	RenewEvery   time.Duration // GENBOX_LEASE_RENEW: renewal interval while the model runs
	MaxExtension time.Duration // GENBOX_MAX_EXTENSION: ack-deadline extension; at least LongestHold (its default)
	Concurrency  int           // GENBOX_CONCURRENCY: model calls at once (the model-call slots)
	ClaimAhead   int           // GENBOX_CLAIM_AHEAD: tasks claimed ahead of a free slot at most (default Concurrency/2, at least 1)
	MaxInFlight  int           // GENBOX_MAX_IN_FLIGHT: task messages in hand at once, the pull's flow control (default 2·Concurrency + ClaimAhead)
	MaxAttempts  int           // GENBOX_TASK_ATTEMPTS: failed generations before a task is dead
	ClaimCap     int           // GENBOX_CLAIM_CAP: takeovers of an expired lease before a task is dead

	RetryBase, RetryMax time.Duration // GENBOX_RETRY_BASE/MAX: not_before after a transient failure
	ParkBase, ParkMax   time.Duration // GENBOX_PARK_BASE/MAX: not_before of a parked (waiting) task
	NudgeGrace          time.Duration // GENBOX_NUDGE_GRACE: sweeper holds off a dead task's DLQ notice this long after our own nudge
	WebhookTimeout      time.Duration // GENBOX_WEBHOOK_TIMEOUT, as the resulthandler's: an ended task's delivery is reserved for one delivery lease of it
	CommitRetry         time.Duration // GENBOX_COMMIT_RETRY: how long an answered output's commit is retried
	ShutdownGrace       time.Duration // GENBOX_SHUTDOWN_GRACE: in-flight calls may finish within it on SIGTERM

	BudgetPolicy  quota.BudgetPolicy // GENBOX_BUDGET_POLICY: wait (default) or fail when a tenant's daily budget is spent
	BudgetRetry   time.Duration      // GENBOX_BUDGET_RETRY: a task waiting on its budget looks again this often at most
	TenantRefresh time.Duration      // GENBOX_TENANT_REFRESH: tenant limits and spend totals re-read, spend flushed
	TenantWaitMax time.Duration      // GENBOX_TENANT_WAIT_MAX: a task waiting for its tenant's slot is looked at again after this at the latest
	CacheTTL      time.Duration      // GENBOX_CACHE_TTL: how long a cached output is served
	FlexMargin    time.Duration      // GENBOX_FLEX_MARGIN: a flex task closer than this to run_before is called on the standard tier
	ContextTTL    time.Duration      // GENBOX_CONTEXT_CACHE_TTL: an explicit context cache's TTL, extended while in use; 0 creates none
	DrillEvery    time.Duration      // GENBOX_FALLBACK_DRILL_INTERVAL: time between fallback drills; 0: none
	PreviewEvery  time.Duration      // GENBOX_PREVIEW_INTERVAL: at most one preview write per streamed task this often

	// DefaultDailyBudgetUSD (GENBOX_DEFAULT_DAILY_BUDGET_USD) is the daily budget of a tenant
	// whose limits set none; 0: such a tenant is not limited.
	DefaultDailyBudgetUSD float64
	// ProjectDailyBudgetUSD (GENBOX_PROJECT_DAILY_BUDGET_USD) caps every tenant together; 0: no
	// cap. It fails closed: while its counter cannot be read, no call starts.
	ProjectDailyBudgetUSD float64

	// Callbacks is the callback URL policy a schedule's fire is validated with, as the
	// publisher's (GENBOX_ALLOW_INSECURE_CALLBACKS, GENBOX_CALLBACK_PORTS).
	Callbacks ssrf.URLPolicy

	Sweep  sweeper.Config
	Batch  batcher.Config
	Gemini gemini.Config
	// Autoscale sizes the pool when GENBOX_AUTOSCALE_POOL names it; its slots are Concurrency.
	Autoscale autoscale.Config
}

// ErrConfig means a setting is invalid; the message names the variable.
var ErrConfig = errors.New("worker: invalid configuration")

// FromEnv reads the configuration, with defaults, calling getenv for every variable it knows.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Port:          8080,
		Subscription:  bus.SubWorker,
		LeaseTTL:      30 * time.Second,
		RenewEvery:    10 * time.Second,
		Concurrency:   64,
		MaxAttempts:   5,
		ClaimCap:      3,
		RetryBase:     5 * time.Second,
		RetryMax:      10 * time.Minute,
		ParkBase:      30 * time.Second,
		ParkMax:       15 * time.Minute,
		NudgeGrace:    time.Minute,
		CommitRetry:   10 * time.Minute,
		ShutdownGrace: 8 * time.Second,
		BudgetRetry:   10 * time.Minute,
		TenantRefresh: 10 * time.Second,
		TenantWaitMax: 5 * time.Minute,
		CacheTTL:      24 * time.Hour,
		FlexMargin:    15 * time.Minute,
		ContextTTL:    time.Hour,
		PreviewEvery:  500 * time.Millisecond,
		BudgetPolicy:  quota.BudgetWait,

		WebhookTimeout: ssrf.DefaultTimeout,
		Callbacks:      ssrf.URLPolicy{Ports: ssrf.DefaultPorts},

		DefaultDailyBudgetUSD: 10,
		ProjectDailyBudgetUSD: 100,
	}
	r := envconfig.New(getenv)
	r.String("GOOGLE_CLOUD_PROJECT", &c.Project)
	r.Port("PORT", &c.Port)
	r.String("GENBOX_INSTANCE_ID", &c.Instance)
	r.String("GENBOX_TASKS_SUBSCRIPTION", &c.Subscription)
	r.String(prompts.EnvDir, &c.PromptsDir)
	r.String(objects.EnvInputBucket, &c.InputBucket)
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = host + "-" + strconv.Itoa(os.Getpid())
	}
	r.Duration("GENBOX_LEASE_TTL", &c.LeaseTTL)
	r.Duration("GENBOX_LEASE_RENEW", &c.RenewEvery)
	r.Duration("GENBOX_MAX_EXTENSION", &c.MaxExtension)
	r.Duration("GENBOX_RETRY_BASE", &c.RetryBase)
	r.Duration("GENBOX_RETRY_MAX", &c.RetryMax)
	r.Duration("GENBOX_PARK_BASE", &c.ParkBase)
	r.Duration("GENBOX_PARK_MAX", &c.ParkMax)
	r.Duration("GENBOX_NUDGE_GRACE", &c.NudgeGrace)
	r.Duration("GENBOX_WEBHOOK_TIMEOUT", &c.WebhookTimeout)
	r.Duration("GENBOX_COMMIT_RETRY", &c.CommitRetry)
	r.Duration("GENBOX_SHUTDOWN_GRACE", &c.ShutdownGrace)
	r.Duration("GENBOX_BUDGET_RETRY", &c.BudgetRetry)
	r.Duration("GENBOX_TENANT_REFRESH", &c.TenantRefresh)
	r.Duration("GENBOX_TENANT_WAIT_MAX", &c.TenantWaitMax)
	r.Duration("GENBOX_CACHE_TTL", &c.CacheTTL)
	r.Duration("GENBOX_FLEX_MARGIN", &c.FlexMargin)
	r.Duration("GENBOX_CONTEXT_CACHE_TTL", &c.ContextTTL)
	r.Duration("GENBOX_FALLBACK_DRILL_INTERVAL", &c.DrillEvery)
	r.Duration("GENBOX_PREVIEW_INTERVAL", &c.PreviewEvery)
	r.Int("GENBOX_CONCURRENCY", &c.Concurrency)
	r.Int("GENBOX_CLAIM_AHEAD", &c.ClaimAhead)
	r.Int("GENBOX_MAX_IN_FLIGHT", &c.MaxInFlight)
	r.Int("GENBOX_TASK_ATTEMPTS", &c.MaxAttempts)
	r.Int("GENBOX_CLAIM_CAP", &c.ClaimCap)
	r.Float("GENBOX_DEFAULT_DAILY_BUDGET_USD", &c.DefaultDailyBudgetUSD)
	r.Float("GENBOX_PROJECT_DAILY_BUDGET_USD", &c.ProjectDailyBudgetUSD)
	r.Bool("GENBOX_ALLOW_INSECURE_CALLBACKS", &c.Callbacks.AllowInsecure)
	r.Func("GENBOX_CALLBACK_PORTS", func(v string) (err error) { c.Callbacks.Ports, err = ssrf.ParsePorts(v); return err })
	r.Func("GENBOX_BUDGET_POLICY", func(s string) (err error) { c.BudgetPolicy, err = quota.ParseBudgetPolicy(s); return err })
	var errs []error
	if err := r.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	var err error
	if c.Sweep, err = sweeper.FromEnv(getenv); err != nil {
		errs = append(errs, err)
	}
	if c.Batch, err = batcher.FromEnv(getenv); err != nil {
		errs = append(errs, err)
	}
	if c.Gemini, err = geminienv.Config(getenv); err != nil {
		errs = append(errs, err)
	}
	if c.Autoscale, err = autoscale.FromEnv(getenv); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	if c.MaxExtension == 0 {
		c.MaxExtension = max(c.LongestHold(), c.LeaseTTL)
	}
	// A claim takes a Firestore transaction: enough of them must be under way, while every slot
	// calls, to start the next call the moment one returns. After its call a task still commits
	// its output, nudges its result and is acked, holding its message but no slot: as many again
	// as the slots leaves room for that.
	if getenv("GENBOX_CLAIM_AHEAD") == "" {
		c.ClaimAhead = max(1, c.Concurrency/2)
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 2*c.Concurrency + c.ClaimAhead
	}
	c.Autoscale.Slots = c.Concurrency
	// A drain waits for every call in hand to end; lowering the count sooner could throw away a
	// paid output whose commit is still being retried.
	if getenv("GENBOX_AUTOSCALE_DRAIN_TIMEOUT") == "" {
		c.Autoscale.DrainTimeout = max(c.Autoscale.DrainTimeout, c.LongestHold())
	}
	return c, c.Validate()
}

// LongestHold bounds how long the worker holds a task message: the longest generation with its
// retries and backoffs (gemini.Config.LongestGenerate), then the commit of its output retried for
// GENBOX_COMMIT_RETRY. Pub/Sub must keep extending the message's ack deadline that long, or it
// redelivers a message whose task is still being worked on.
func (c Config) LongestHold() time.Duration { return c.Gemini.LongestGenerate() + c.CommitRetry }

// Validate reports every setting that cannot work, naming its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, name, why)) }
	if c.Project == "" {
		bad("GOOGLE_CLOUD_PROJECT", "is required")
	}
	if c.LeaseTTL <= 0 {
		bad("GENBOX_LEASE_TTL", "must be positive")
	}
	if c.RenewEvery <= 0 || c.RenewEvery >= c.LeaseTTL {
		bad("GENBOX_LEASE_RENEW", "must be positive and shorter than GENBOX_LEASE_TTL")
	}
	if c.MaxExtension < c.LeaseTTL {
		bad("GENBOX_MAX_EXTENSION", "must cover at least GENBOX_LEASE_TTL")
	}
	if hold := c.LongestHold(); c.MaxExtension < hold {
		bad("GENBOX_MAX_EXTENSION", fmt.Sprintf("is %s, shorter than the longest a task message can be held: %s "+
			"(GENBOX_MAX_ATTEMPTS × GENBOX_CALL_TIMEOUT, a backoff of GENBOX_BACKOFF_MAX or GENBOX_MAX_RETRY_WAIT before each retry, "+
			"then GENBOX_COMMIT_RETRY); leave it unset to derive it", c.MaxExtension, hold))
	}
	if c.Concurrency < 1 {
		bad("GENBOX_CONCURRENCY", "must be at least 1")
	}
	if c.ClaimAhead < 0 {
		bad("GENBOX_CLAIM_AHEAD", "must not be negative (0: a task is claimed only when a model-call slot is free)")
	}
	if c.MaxInFlight < 1 {
		bad("GENBOX_MAX_IN_FLIGHT", "must be at least 1")
	}
	if c.MaxAttempts < 1 {
		bad("GENBOX_TASK_ATTEMPTS", "must be at least 1")
	}
	if c.ClaimCap < 1 {
		bad("GENBOX_CLAIM_CAP", "must be at least 1")
	}
	if c.RetryBase <= 0 || c.RetryMax < c.RetryBase {
		bad("GENBOX_RETRY_BASE/GENBOX_RETRY_MAX", "must be positive with base <= max")
	}
	if c.ParkBase <= 0 || c.ParkMax < c.ParkBase {
		bad("GENBOX_PARK_BASE/GENBOX_PARK_MAX", "must be positive with base <= max")
	}
	if c.NudgeGrace <= 0 {
		bad("GENBOX_NUDGE_GRACE", "must be positive")
	}
	if c.CommitRetry <= 0 {
		bad("GENBOX_COMMIT_RETRY", "must be positive")
	}
	for _, v := range []struct {
		name string
		d    time.Duration
	}{
		{"GENBOX_BUDGET_RETRY", c.BudgetRetry}, {"GENBOX_TENANT_REFRESH", c.TenantRefresh},
		{"GENBOX_TENANT_WAIT_MAX", c.TenantWaitMax}, {"GENBOX_CACHE_TTL", c.CacheTTL}, {"GENBOX_FLEX_MARGIN", c.FlexMargin},
		{"GENBOX_PREVIEW_INTERVAL", c.PreviewEvery}, {"GENBOX_WEBHOOK_TIMEOUT", c.WebhookTimeout},
	} {
		if v.d <= 0 {
			bad(v.name, "must be positive")
		}
	}
	if c.ContextTTL < 0 {
		bad("GENBOX_CONTEXT_CACHE_TTL", "must not be negative")
	}
	for _, v := range []struct {
		name string
		usd  float64
	}{{"GENBOX_DEFAULT_DAILY_BUDGET_USD", c.DefaultDailyBudgetUSD}, {"GENBOX_PROJECT_DAILY_BUDGET_USD", c.ProjectDailyBudgetUSD}} {
		if v.usd < 0 || math.IsInf(v.usd, 0) || math.IsNaN(v.usd) {
			bad(v.name, "must be a non-negative amount of USD (0: none)")
		}
	}
	if c.ShutdownGrace < 0 {
		bad("GENBOX_SHUTDOWN_GRACE", "must not be negative")
	}
	if c.DrillEvery < 0 {
		bad("GENBOX_FALLBACK_DRILL_INTERVAL", "must not be negative (0: no drill)")
	}
	return errors.Join(errs...)
}

// Policy is the part of Config the message handler applies.
func (c Config) Policy() Policy {
	return Policy{
		Owner: c.Instance, LeaseTTL: c.LeaseTTL, RenewEvery: c.RenewEvery,
		MaxAttempts: c.MaxAttempts, ClaimCap: c.ClaimCap,
		RetryBase: c.RetryBase, RetryMax: c.RetryMax, ParkBase: c.ParkBase, ParkMax: c.ParkMax,
		NudgeGrace: c.NudgeGrace, DeliveryLease: protocol.DeliveryLease(c.WebhookTimeout), CommitRetry: c.CommitRetry,
		FlexMargin: c.FlexMargin, PreviewEvery: c.PreviewEvery,
	}
}

// ModelPolicy builds the policy the handler applies before each call: tenant limits and spend
// read through s, budget reservations on this instance, and the tenants' rpm and tpm shared
// through s. The caller runs its Budgets' and Rates' Flush every TenantRefresh and at shutdown.
func (c Config) ModelPolicy(s *store.Store, est Estimator) ModelPolicy {
	return ModelPolicy{
		Estimator:             est,
		Tenants:               NewTenantCache(s, c.TenantRefresh),
		Budgets:               quota.NewBudgets(s, time.Now, c.TenantRefresh, quota.WithProjectLimit(c.ProjectDailyBudgetUSD)),
		Rates:                 quota.NewTenantRates(s, time.Now, time.Minute),
		BudgetPolicy:          c.BudgetPolicy,
		DefaultDailyBudgetUSD: c.DefaultDailyBudgetUSD,
		BudgetRetry:           c.BudgetRetry,
		CacheTTL:              c.CacheTTL,
	}
}
