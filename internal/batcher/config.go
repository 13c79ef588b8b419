package batcher

import (
	"errors"
	"fmt"
	"time"

	"github.com/genbox-dev/genbox/internal/envconfig"
)

// Config is the batcher's configuration, and the deadlines the worker holds batch tasks by.
type Config struct {
	Interval time.Duration // GENBOX_BATCH_INTERVAL: time between passes
	MaxTasks int           // GENBOX_BATCH_MAX_TASKS: tasks per job at most (one transaction claims them)
	// MaxBytes bounds a job's inlined requests (gemini.Client.BatchSize): Gemini refuses a
	// create over 20 MB.
	MaxBytes int // GENBOX_BATCH_MAX_BYTES
	// Wait is how long the oldest waiting task waits for a fuller job: a job is created when
	// MaxTasks are waiting, or when the oldest has waited this long.
	Wait      time.Duration // GENBOX_BATCH_WAIT
	PollMax   time.Duration // GENBOX_BATCH_POLL_MAX: the cap of the poll backoff (it starts at Interval)
	LeaseTTL  time.Duration // GENBOX_BATCH_LEASE_TTL: the batch lease of a job's tasks, renewed while it runs
	LeaderTTL time.Duration // GENBOX_BATCH_LEADER_TTL: the leadership lease of a model's batcher
	// Deadline bounds a batch task whose run_before is later or unset: a batch task accepts up
	// to this long.
	Deadline time.Duration // GENBOX_BATCH_DEADLINE
	// Margin is kept before a batch task's deadline to run it online: a task leaves batching
	// (and a job still running is cancelled) this long before.
	Margin time.Duration // GENBOX_BATCH_MARGIN
	// CallTimeout bounds one call of the Batch API.
	CallTimeout time.Duration // GENBOX_BATCH_CALL_TIMEOUT
}

// ErrConfig means a batcher setting is invalid; the message names the variable.
var ErrConfig = errors.New("batcher: invalid configuration")

// FromEnv reads the configuration with defaults, calling getenv for every variable it knows.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Interval: 30 * time.Second, MaxTasks: 400, MaxBytes: 16 << 20, Wait: 5 * time.Minute, PollMax: 5 * time.Minute,
		LeaseTTL: 15 * time.Minute, Deadline: 24 * time.Hour, Margin: time.Hour, CallTimeout: time.Minute,
	}
	r := envconfig.New(getenv)
	r.Duration("GENBOX_BATCH_INTERVAL", &c.Interval)
	r.Int("GENBOX_BATCH_MAX_TASKS", &c.MaxTasks)
	r.Int("GENBOX_BATCH_MAX_BYTES", &c.MaxBytes)
	r.Duration("GENBOX_BATCH_WAIT", &c.Wait)
	r.Duration("GENBOX_BATCH_POLL_MAX", &c.PollMax)
	r.Duration("GENBOX_BATCH_LEASE_TTL", &c.LeaseTTL)
	r.Duration("GENBOX_BATCH_LEADER_TTL", &c.LeaderTTL)
	r.Duration("GENBOX_BATCH_DEADLINE", &c.Deadline)
	r.Duration("GENBOX_BATCH_MARGIN", &c.Margin)
	r.Duration("GENBOX_BATCH_CALL_TIMEOUT", &c.CallTimeout)
	if err := r.Err(); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.LeaderTTL == 0 {
		c.LeaderTTL = 3 * c.Interval
	}
	return c, c.Validate()
}

// maxJobTasks is what one Firestore transaction can claim with the job's document: 500 writes.
const maxJobTasks = 499

// maxJobBytes is Gemini's limit on a batch create's body: 20 MB.
const maxJobBytes = 20 << 20

// Validate reports every setting that cannot work, naming its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, name, why)) }
	if c.Interval <= 0 {
		bad("GENBOX_BATCH_INTERVAL", "must be positive")
	}
	if c.MaxTasks < 1 || c.MaxTasks > maxJobTasks {
		bad("GENBOX_BATCH_MAX_TASKS", fmt.Sprintf("must be in 1..%d (one transaction claims a job)", maxJobTasks))
	}
	if c.MaxBytes < 1 || c.MaxBytes > maxJobBytes {
		bad("GENBOX_BATCH_MAX_BYTES", fmt.Sprintf("must be in 1..%d (Gemini's limit on a batch of inlined requests)", maxJobBytes))
	}
	if c.Wait < 0 {
		bad("GENBOX_BATCH_WAIT", "must not be negative")
	}
	if c.PollMax < c.Interval {
		bad("GENBOX_BATCH_POLL_MAX", "must be at least GENBOX_BATCH_INTERVAL")
	}
	if c.LeaseTTL < 4*c.Interval {
		bad("GENBOX_BATCH_LEASE_TTL", "must be at least four times GENBOX_BATCH_INTERVAL (the lease is renewed by the passes)")
	}
	if c.LeaderTTL <= c.Interval {
		bad("GENBOX_BATCH_LEADER_TTL", "must be longer than GENBOX_BATCH_INTERVAL")
	}
	if c.Deadline <= 0 || c.Margin <= 0 || c.Margin >= c.Deadline {
		bad("GENBOX_BATCH_DEADLINE/GENBOX_BATCH_MARGIN", "must be positive with the margin shorter than the deadline")
	}
	if c.CallTimeout <= 0 {
		bad("GENBOX_BATCH_CALL_TIMEOUT", "must be positive")
	}
	return errors.Join(errs...)
}
