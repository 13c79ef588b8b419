package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// BudgetsCollection holds the sharded daily spend counters: budgets/{tenant}:{day}:{shard}.
const BudgetsCollection = "budgets"

// BudgetShards is the number of counter documents per tenant and day: one hot counter document
// would serialize every task of a busy tenant (about one write per second per document).
const BudgetShards = 8

// budgetRetention keeps a day's counters a little past the day, for reports.
const budgetRetention = 3 * 24 * time.Hour

var _ gemini.SpendStore = (*Store)(nil)

func (s *Store) budgetShard(tenant, day string, shard int) *firestore.DocumentRef {
	return s.FS.Collection(BudgetsCollection).Doc(fmt.Sprintf("%s:%s:%d", tenant, day, shard))
}

// AddSpend adds usd to one random shard of tenant's counter for day.
func (s *Store) AddSpend(ctx context.Context, tenant, day string, usd float64) error {
	ref := s.budgetShard(tenant, day, rand.IntN(BudgetShards))
	_, err := ref.Set(ctx, map[string]any{
		"tenant":    tenant,
		"day":       day,
		"spent_usd": firestore.Increment(usd),
		"expire_at": s.now().Add(budgetRetention),
	}, firestore.MergeAll)
	if err != nil {
		return fmt.Errorf("add spend of %s on %s: %w", tenant, day, err)
	}
	return nil
}

// Spent sums tenant's counter shards for day.
func (s *Store) Spent(ctx context.Context, tenant, day string) (float64, error) {
	refs := make([]*firestore.DocumentRef, BudgetShards)
	for i := range refs {
		refs[i] = s.budgetShard(tenant, day, i)
	}
	snaps, err := s.FS.GetAll(ctx, refs)
	if err != nil {
		return 0, fmt.Errorf("read spend of %s on %s: %w", tenant, day, err)
	}
	var total float64
	for _, snap := range snaps {
		if !snap.Exists() {
			continue
		}
		v, err := snap.DataAt("spent_usd")
		if err != nil {
			return 0, fmt.Errorf("read spend shard %s: %w", snap.Ref.ID, err)
		}
		switch n := v.(type) {
		case float64:
			total += n
		case int64:
			total += float64(n)
		}
	}
	return total, nil
}
