package sweeper

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFromEnv(t *testing.T) {
	t.Parallel()
	all := []string{"GENBOX_SWEEP_INTERVAL", "GENBOX_SWEEP_LIMIT", "GENBOX_SWEEP_PACE", "GENBOX_SWEEP_RELEASE_RATE",
		"GENBOX_SWEEP_LEADER_TTL", "GENBOX_SWEEP_BACKOFF_BASE", "GENBOX_SWEEP_BACKOFF_MAX", "GENBOX_SWEEP_SHARDS"}
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string
	}{
		{name: "defaults", want: Config{Interval: 5 * time.Second, Limit: 500, Pace: 200, ReleaseRate: 20,
			LeaderTTL: 15 * time.Second, BackoffBase: 30 * time.Second, BackoffMax: 15 * time.Minute, Shards: 1}},
		{name: "set", env: map[string]string{"GENBOX_SWEEP_INTERVAL": "1s", "GENBOX_SWEEP_LIMIT": "10", "GENBOX_SWEEP_PACE": "2.5",
			"GENBOX_SWEEP_RELEASE_RATE": "1", "GENBOX_SWEEP_LEADER_TTL": "4s", "GENBOX_SWEEP_BACKOFF_BASE": "1s", "GENBOX_SWEEP_BACKOFF_MAX": "2s",
			"GENBOX_SWEEP_SHARDS": "8"},
			want: Config{Interval: time.Second, Limit: 10, Pace: 2.5, ReleaseRate: 1, LeaderTTL: 4 * time.Second,
				BackoffBase: time.Second, BackoffMax: 2 * time.Second, Shards: 8}},
		{name: "bad duration", env: map[string]string{"GENBOX_SWEEP_BACKOFF_MAX": "soon"}, wantErr: "GENBOX_SWEEP_BACKOFF_MAX"},
		{name: "bad int", env: map[string]string{"GENBOX_SWEEP_LIMIT": "many"}, wantErr: "GENBOX_SWEEP_LIMIT"},
		{name: "bad float", env: map[string]string{"GENBOX_SWEEP_PACE": "fast"}, wantErr: "GENBOX_SWEEP_PACE"},
		{name: "ttl not above interval", env: map[string]string{"GENBOX_SWEEP_LEADER_TTL": "5s"}, wantErr: "GENBOX_SWEEP_LEADER_TTL"},
		{name: "zero limit", env: map[string]string{"GENBOX_SWEEP_LIMIT": "0"}, wantErr: "GENBOX_SWEEP_LIMIT"},
		{name: "no shard", env: map[string]string{"GENBOX_SWEEP_SHARDS": "0"}, wantErr: "GENBOX_SWEEP_SHARDS"},
		{name: "too many shards", env: map[string]string{"GENBOX_SWEEP_SHARDS": "129"}, wantErr: "GENBOX_SWEEP_SHARDS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			asked := map[string]bool{}
			c, err := FromEnv(func(k string) string { asked[k] = true; return tt.env[k] })
			if tt.wantErr != "" {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want an ErrConfig naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || c != tt.want {
				t.Fatalf("FromEnv = %+v, %v; want %+v", c, err, tt.want)
			}
			for _, k := range all {
				if !asked[k] {
					t.Errorf("FromEnv never read %s", k)
				}
			}
		})
	}
}
