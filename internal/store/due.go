package store

import (
	"fmt"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/envconfig"
)

// ShardsFromEnv reads GENBOX_SWEEP_SHARDS (default 1): every service that writes tasks spreads
// them over that many sweep shards, and the worker's sweeper leads them.
func ShardsFromEnv(getenv func(string) string) (int, error) {
	n := 1
	r := envconfig.New(getenv)
	r.Int("GENBOX_SWEEP_SHARDS", &n)
	if err := r.Err(); err != nil {
		return 0, err
	}
	if n < 1 || n > protocol.MaxShards {
		return 0, fmt.Errorf("GENBOX_SWEEP_SHARDS must be between 1 and %d, got %d", protocol.MaxShards, n)
	}
	return n, nil
}
