package autoscale

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWant(t *testing.T) {
	t.Parallel()
	c := Config{Min: 0, Max: 8, Headroom: 1.25, DrainTarget: 30 * time.Second, Slots: 16}
	tests := []struct {
		name    string
		min     int
		b       Backlog
		latency time.Duration
		want    int
	}{
		{"nothing pending sleeps", 0, Backlog{}, time.Second, 0},
		{"nothing pending keeps the minimum", 2, Backlog{}, time.Second, 2},
		{"a retry not yet due keeps one", 0, Backlog{Pending: true}, time.Second, 1},
		{"parked tasks keep one", 0, Backlog{Waiting: 500}, time.Second, 1},
		{"tasks in batch jobs keep one", 0, Backlog{Batched: 10000}, time.Second, 1},
		{"running tasks: a slot each, with headroom", 0, Backlog{Running: 32}, time.Second, 3},
		{"a queue served within the target at 1 s a call", 0, Backlog{Queued: 600}, time.Second, 2},
		{"a queue of calls longer than the target: a slot each", 0, Backlog{Queued: 64}, time.Minute, 5},
		{"capped at max", 0, Backlog{Queued: 2000}, time.Minute, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := c
			c.Min = tt.min
			if got := c.Want(tt.b, tt.latency); got != tt.want {
				t.Errorf("Want(%+v, %s) = %d, want %d", tt.b, tt.latency, got, tt.want)
			}
		})
	}
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Enabled() || c.Max != 10 || c.Interval != 5*time.Second || c.IdleAfter != 5*time.Minute {
		t.Errorf("defaults: %+v", c)
	}
	c, err = FromEnv(env(map[string]string{"GENBOX_AUTOSCALE_POOL": "projects/p/locations/r/workerPools/genbox-worker", "GENBOX_AUTOSCALE_MAX": "4"}))
	if err != nil || !c.Enabled() || c.poolID() != "genbox-worker" || c.Max != 4 {
		t.Errorf("pool: %+v, %v", c, err)
	}
	for name, kv := range map[string]map[string]string{
		"GENBOX_AUTOSCALE_POOL":          {"GENBOX_AUTOSCALE_POOL": "genbox-worker"},
		"GENBOX_AUTOSCALE_MIN":           {"GENBOX_AUTOSCALE_MIN": "5", "GENBOX_AUTOSCALE_MAX": "4"},
		"GENBOX_AUTOSCALE_HEADROOM":      {"GENBOX_AUTOSCALE_HEADROOM": "0.5"},
		"GENBOX_AUTOSCALE_DRAIN_TIMEOUT": {"GENBOX_AUTOSCALE_DRAIN_TIMEOUT": "1s"},
		"GENBOX_AUTOSCALE_IDLE":          {"GENBOX_AUTOSCALE_IDLE": "soon"},
	} {
		_, err := FromEnv(env(kv))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: %v, want an ErrConfig naming %s", kv, err, name)
		}
	}
	w, err := WakeFromEnv(env(map[string]string{"GENBOX_AUTOSCALE_POOL": "projects/p/locations/r/workerPools/w", "GENBOX_AUTOSCALE_MAX": "0"}))
	if err != nil || w.Max != 10 {
		t.Errorf("a waker reads only the pool, the emulator and the interval: %+v, %v", w, err)
	}
}
