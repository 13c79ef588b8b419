package batcher

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if c.Deadline != 24*time.Hour || c.LeaderTTL != 3*c.Interval || c.MaxTasks != 400 || c.MaxBytes != 16<<20 {
		t.Errorf("defaults %+v", c)
	}
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"tasks over a transaction":  {map[string]string{"GENBOX_BATCH_MAX_TASKS": "500"}, "GENBOX_BATCH_MAX_TASKS"},
		"bytes over Gemini's limit": {map[string]string{"GENBOX_BATCH_MAX_BYTES": "30000000"}, "GENBOX_BATCH_MAX_BYTES"},
		"margin past the deadline":  {map[string]string{"GENBOX_BATCH_MARGIN": "25h"}, "GENBOX_BATCH_MARGIN"},
		"lease shorter than passes": {map[string]string{"GENBOX_BATCH_LEASE_TTL": "1m"}, "GENBOX_BATCH_LEASE_TTL"},
		"poll cap under interval":   {map[string]string{"GENBOX_BATCH_POLL_MAX": "1s"}, "GENBOX_BATCH_POLL_MAX"},
		"not a duration":            {map[string]string{"GENBOX_BATCH_WAIT": "soon"}, "GENBOX_BATCH_WAIT"},
	} {
		_, err := FromEnv(func(k string) string { return tc.env[k] })
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig naming %s", name, err, tc.want)
		}
	}
}
