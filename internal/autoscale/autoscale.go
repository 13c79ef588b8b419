// Package autoscale sizes the worker pool (a Cloud Run worker pool, scaled manually) from the
// backlog Firestore holds, and never stops an instance in the middle of a model call.
//
// One leader (a lease like the sweeper's, leaders/autoscaler) runs the Controller in a worker
// instance: each Interval it counts the tasks queued, running and parked, measures how long a
// call holds a slot, and sets the pool's instance count within Min..Max through the Cloud Run
// Admin API — at once when the backlog needs more, after ScaleInAfter of lower need when it
// needs fewer, to zero after IdleAfter with nothing pending. Cloud Run picks which instances a
// lower count stops, so a scale-in drains first: the controller raises a drain in the pool's
// document (scaling/{pool}); every worker (Member) stops claiming, lets its calls finish and
// says so; only then is the count lowered, and the survivors resume once the stopped instances
// have left. A pool at zero has no controller: whoever nudges gemini-tasks (the publisher, the
// dlqnotifier) wakes it through the same document (Waker). Workers take their share of the
// Gemini quota from the document's instance count.
package autoscale

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/envconfig"
)

// Collection holds one document per pool (its short name): the State the controller, the
// members and the wakers share; its members subcollection holds one document per instance.
const Collection = "scaling"

// LeaderDoc is the leaders/{id} document whose lease makes one instance the controller.
const LeaderDoc = "autoscaler"

// Config is the autoscaler's configuration, read by every service that scales or wakes the
// pool: the worker (controller and member), the publisher and the dlqnotifier (wakers).
type Config struct {
	// Pool is the worker pool's resource name, projects/P/locations/R/workerPools/NAME
	// (GENBOX_AUTOSCALE_POOL); empty: the pool keeps the instance count Terraform gave it.
	Pool string
	// AdminEmulator (GENBOX_RUN_ADMIN_EMULATOR_HOST) is a host:port serving the Cloud Run Admin
	// API without TLS or credentials: a fake in tests and genbox dev.
	AdminEmulator string
	Min, Max      int           // GENBOX_AUTOSCALE_MIN (0), GENBOX_AUTOSCALE_MAX (10): instances
	Interval      time.Duration // GENBOX_AUTOSCALE_INTERVAL (5 s): the controller's tick, the members' beat, a waker's cache
	Headroom      float64       // GENBOX_AUTOSCALE_HEADROOM (1.25): slots provisioned per slot of demand
	// DrainTarget (GENBOX_AUTOSCALE_DRAIN_TARGET, 1 min) is how soon the queued backlog should
	// be served at the measured rate; a backlog the pool serves in one call's time asks for a
	// slot per task.
	DrainTarget  time.Duration
	ScaleInAfter time.Duration // GENBOX_AUTOSCALE_SCALE_IN_AFTER (1 min): lower need held this long before a scale-in
	IdleAfter    time.Duration // GENBOX_AUTOSCALE_IDLE (5 min): nothing pending this long before the pool sleeps
	// DrainTimeout (GENBOX_AUTOSCALE_DRAIN_TIMEOUT, 10 min; the worker raises it to the longest
	// it can hold a task) bounds a drain: past it the count is lowered anyway (counted as forced).
	DrainTimeout time.Duration
	// Latency (GENBOX_AUTOSCALE_LATENCY, 10 s) is how long a call holds its slot until the
	// members have measured it.
	Latency time.Duration
	// Slots is the model-call slots of an instance (the worker's GENBOX_CONCURRENCY).
	Slots int
}

// Enabled reports whether the pool is autoscaled.
func (c Config) Enabled() bool { return c.Pool != "" }

// ErrConfig means an autoscaler setting is invalid; the message names the variable.
var ErrConfig = errors.New("autoscale: invalid configuration")

// FromEnv reads the configuration with defaults, calling getenv for every variable it knows.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Max: 10, Interval: 5 * time.Second, Headroom: 1.25, DrainTarget: time.Minute,
		ScaleInAfter: time.Minute, IdleAfter: 5 * time.Minute, DrainTimeout: 10 * time.Minute, Latency: 10 * time.Second, Slots: 1,
	}
	r := envconfig.New(getenv)
	wakeVars(r, &c)
	r.Int("GENBOX_AUTOSCALE_MIN", &c.Min)
	r.Int("GENBOX_AUTOSCALE_MAX", &c.Max)
	r.Float("GENBOX_AUTOSCALE_HEADROOM", &c.Headroom)
	r.Duration("GENBOX_AUTOSCALE_DRAIN_TARGET", &c.DrainTarget)
	r.Duration("GENBOX_AUTOSCALE_SCALE_IN_AFTER", &c.ScaleInAfter)
	r.Duration("GENBOX_AUTOSCALE_IDLE", &c.IdleAfter)
	r.Duration("GENBOX_AUTOSCALE_DRAIN_TIMEOUT", &c.DrainTimeout)
	r.Duration("GENBOX_AUTOSCALE_LATENCY", &c.Latency)
	if err := r.Err(); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, c.Validate()
}

// WakeFromEnv reads what a waker needs (the publisher's, the dlqnotifier's): the pool, the Admin
// API's emulator and the interval, the rest of the configuration at its defaults.
func WakeFromEnv(getenv func(string) string) (Config, error) {
	c, _ := FromEnv(func(string) string { return "" })
	r := envconfig.New(getenv)
	wakeVars(r, &c)
	if err := r.Err(); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, c.Validate()
}

func wakeVars(r *envconfig.Reader, c *Config) {
	r.String("GENBOX_AUTOSCALE_POOL", &c.Pool)
	r.String("GENBOX_RUN_ADMIN_EMULATOR_HOST", &c.AdminEmulator)
	r.Duration("GENBOX_AUTOSCALE_INTERVAL", &c.Interval)
}

// Validate reports every setting that cannot work, naming its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, name, why)) }
	if c.Pool != "" && (!strings.HasPrefix(c.Pool, "projects/") || !strings.Contains(c.Pool, "/workerPools/")) {
		bad("GENBOX_AUTOSCALE_POOL", "must be projects/PROJECT/locations/REGION/workerPools/NAME")
	}
	if c.Min < 0 || c.Max < 1 || c.Max < c.Min {
		bad("GENBOX_AUTOSCALE_MIN/GENBOX_AUTOSCALE_MAX", "must be 0 <= min <= max with max >= 1")
	}
	if !(c.Headroom >= 1) || math.IsInf(c.Headroom, 0) {
		bad("GENBOX_AUTOSCALE_HEADROOM", "must be at least 1")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"GENBOX_AUTOSCALE_INTERVAL", c.Interval}, {"GENBOX_AUTOSCALE_DRAIN_TARGET", c.DrainTarget},
		{"GENBOX_AUTOSCALE_SCALE_IN_AFTER", c.ScaleInAfter}, {"GENBOX_AUTOSCALE_IDLE", c.IdleAfter},
		{"GENBOX_AUTOSCALE_DRAIN_TIMEOUT", c.DrainTimeout}, {"GENBOX_AUTOSCALE_LATENCY", c.Latency},
	} {
		if d.v <= 0 {
			bad(d.name, "must be positive")
		}
	}
	if c.DrainTimeout <= c.Interval {
		bad("GENBOX_AUTOSCALE_DRAIN_TIMEOUT", "must be longer than GENBOX_AUTOSCALE_INTERVAL")
	}
	return errors.Join(errs...)
}

// poolID is the document id of the pool: the last segment of its resource name.
func (c Config) poolID() string { return c.Pool[strings.LastIndex(c.Pool, "/")+1:] }

// Backlog is what Firestore says the pool has to do.
type Backlog struct {
	Queued, Running, Waiting int64 // tasks in each state, Running without Batched
	// Batched are running tasks inside Gemini batch jobs: they hold no slot, but the batcher
	// that polls their jobs runs in an instance.
	Batched int64
	// Pending says some document is due now or later (its due_at is set: a retry, a
	// delivery, a DLQ notice), a schedule is not paused or a re-run is running. A pool at zero
	// runs no sweeper, schedule firer or re-run pacer, so it sleeps only without any.
	Pending bool
}

// Want is the instance count the backlog asks for, given how long a call holds a slot: enough
// slots, with Headroom, for the running tasks and for the queued ones to be served within
// DrainTarget (at least one call's time); at least one instance while anything is pending; Min
// when nothing is; never past Max.
func (c Config) Want(b Backlog, latency time.Duration) int {
	if !b.Pending && b.Queued+b.Running+b.Waiting+b.Batched == 0 {
		return c.Min
	}
	l := max(latency, time.Millisecond)
	within := max(c.DrainTarget, l)
	slots := float64(b.Running) + float64(b.Queued)*float64(l)/float64(within)
	n := int(math.Ceil(c.Headroom*slots/float64(max(c.Slots, 1)) - 1e-9))
	return min(max(n, c.Min, 1), c.Max)
}

// State is the pool's document, scaling/{pool}: what the controller set, the drain in
// progress, and the last wake.
type State struct {
	Instances int  `firestore:"instances"` // the count last set on the pool
	Draining  bool `firestore:"draining"`  // members stop claiming until it ends
	Target    int  `firestore:"target"`    // while draining: the count the pool shrinks to
	// Settling: the count was lowered to Target; the drain ends once the stopped instances left.
	Settling  bool       `firestore:"settling"`
	Epoch     int64      `firestore:"epoch"` // of the current or the last drain
	DrainFrom *time.Time `firestore:"drain_from,omitempty"`
	WakeAt    *time.Time `firestore:"wake_at,omitempty"` // the last wake of a pool at zero
	Forced    int64      `firestore:"forced"`            // drains that timed out before every member had drained
	UpdatedAt time.Time  `firestore:"updated_at"`
}

// Share is the fraction of the Gemini quota each instance takes: 1 / the instance count.
func (s State) Share() float64 { return 1 / float64(max(s.Instances, 1)) }

// asleep reports whether the pool is at zero or draining to it: a wake must act.
func (s State) asleep() bool { return s.Instances == 0 || (s.Draining && s.Target == 0 && !s.Settling) }

// member is an instance's document, scaling/{pool}/members/{owner}: it is alive until
// ExpiresAt, has drained the drain of epoch Drained, and reports its slots' load.
type member struct {
	Owner     string    `firestore:"owner"`
	BeatAt    time.Time `firestore:"beat_at"`
	ExpiresAt time.Time `firestore:"expires_at"`
	Drained   int64     `firestore:"drained"`
	Slots     int       `firestore:"slots"`
	Calling   int       `firestore:"calling"`
	Served    int64     `firestore:"served"`  // calls ended since the instance started
	BusyMS    int64     `firestore:"busy_ms"` // how long they held their slot
}

// Load is what an instance's model-call slots are doing (the worker's Handler.Load).
type Load struct {
	Slots   int           // model-call slots; 0: unbounded
	Calling int           // slots held by a call now
	Served  int64         // calls that have ended since the start
	Busy    time.Duration // how long those calls held their slot in all
}
