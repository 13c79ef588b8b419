package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/quota"
)

// BudgetsCollection holds the sharded daily spend counters: budgets/{tenant}:{day}:{shard}.
const BudgetsCollection = "budgets"

// BudgetShards is the number of counter documents per tenant and day: one hot counter document
// would serialize every task of a busy tenant (about one write per second per document).
const BudgetShards = 8

// budgetRetention keeps a day's counters a little past the day, for reports.
const budgetRetention = 3 * 24 * time.Hour

var _ quota.SpendStore = (*Store)(nil)

func (s *Store) budgetShard(tenant, day string, shard int) *firestore.DocumentRef {
	return s.FS.Collection(BudgetsCollection).Doc(fmt.Sprintf("%s:%s:%d", tenant, day, shard))
}

// spendShard is the shard an instance's batches go to: always the same one, so that the record
// of its last counted batch and the total it belongs to are read and written together.
func spendShard(origin string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(origin))
	return int(h.Sum32() % BudgetShards)
}

// flushedPath is where a shard records the last batch of origin it counted.
func flushedPath(origin string) firestore.FieldPath { return firestore.FieldPath{"flushed", origin} }

// AddSpend adds f to its origin's shard of the tenant's counter for the day, in a transaction that
// also records f.Seq as the origin's last counted batch; a batch at or below that record is
// already counted and changes nothing.
func (s *Store) AddSpend(ctx context.Context, f quota.SpendFlush) error {
	ref := s.budgetShard(f.Tenant, f.Day, spendShard(f.Origin))
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		var spent float64
		snap, err := tx.Get(ref)
		switch {
		case status.Code(err) == codes.NotFound:
		case err != nil:
			return err
		default:
			if applied, _ := int64At(snap, flushedPath(f.Origin)); applied >= f.Seq {
				return nil
			}
			spent, err = spentOf(snap)
			if err != nil {
				return err
			}
		}
		return tx.Set(ref, map[string]any{
			"tenant":    f.Tenant,
			"day":       f.Day,
			"spent_usd": spent + f.USD,
			"flushed":   map[string]any{f.Origin: f.Seq},
			"expire_at": s.now().Add(budgetRetention),
		}, firestore.MergeAll)
	}, s.txOptions()...)
	if err != nil {
		return fmt.Errorf("add spend of %s on %s: %w", f.Tenant, f.Day, err)
	}
	return nil
}

// Spent sums tenant's counter shards for day, and reads the last batch of origin they count.
func (s *Store) Spent(ctx context.Context, tenant, day, origin string) (float64, int64, error) {
	refs := make([]*firestore.DocumentRef, BudgetShards)
	for i := range refs {
		refs[i] = s.budgetShard(tenant, day, i)
	}
	snaps, err := s.FS.GetAll(ctx, refs)
	if err != nil {
		return 0, 0, fmt.Errorf("read spend of %s on %s: %w", tenant, day, err)
	}
	var total float64
	var applied int64
	for i, snap := range snaps {
		if !snap.Exists() {
			continue
		}
		v, err := spentOf(snap)
		if err != nil {
			return 0, 0, err
		}
		total += v
		if origin != "" && i == spendShard(origin) {
			applied, _ = int64At(snap, flushedPath(origin))
		}
	}
	return total, applied, nil
}

// spentOf reads a shard's spent_usd.
func spentOf(snap *firestore.DocumentSnapshot) (float64, error) {
	v, err := snap.DataAt("spent_usd")
	if err != nil {
		return 0, fmt.Errorf("read spend shard %s: %w", snap.Ref.ID, err)
	}
	switch n := v.(type) {
	case float64:
		return n, nil
	case int64:
		return float64(n), nil
	}
	return 0, fmt.Errorf("read spend shard %s: spent_usd is %T", snap.Ref.ID, v)
}

// int64At reads an integer field; ok is false when it is absent.
func int64At(snap *firestore.DocumentSnapshot, path firestore.FieldPath) (int64, bool) {
	v, err := snap.DataAtPath(path)
	if err != nil {
		return 0, false
	}
	n, ok := v.(int64)
	return n, ok
}
