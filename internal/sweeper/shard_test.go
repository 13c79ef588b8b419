package sweeper

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/task"
)

// shardConfig is testConfig with n shards.
func shardConfig(n int) Config {
	c := testConfig()
	c.Shards = n
	return c
}

// dueTasks writes n queued tasks, due now, spread over s.Shards by Finalize, and returns their ids.
func dueTasks(t *testing.T, s *store.Store, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("t%03d", i)
		create(t, s, ids[i], func(*protocol.Task) {})
	}
	return ids
}

// leaders returns the owner of each shard's leadership lease, "" when nobody holds it.
func leaders(t *testing.T, s *store.Store, shards int) []string {
	t.Helper()
	out := make([]string, shards)
	for k := range out {
		d := claim.Doc{FS: s.FS, Ref: s.FS.Collection(store.LeadersCollection).Doc(LeaderDocOf(k))}
		l, err := d.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if l.Live(s.Now()) {
			out[k] = l.Owner
		}
	}
	return out
}

// nudgedTasks returns the ids nudged on gemini-tasks, sorted.
func nudgedTasks(pub *testenv.Publisher) []string {
	var ids []string
	for _, m := range pub.Take() {
		ids = append(ids, m.Attrs[task.AttrTaskID])
	}
	slices.Sort(ids)
	return ids
}

// Every writer stores the task's shard with its due_at, and each shard's pass nudges the due
// tasks of its shard only; the shard-0 pass also nudges the strays — a document written before
// there were shards (no due_shard) and one written with more shards than there are now — and
// gives them a shard of their own.
func TestEveryShardIsRedriven(t *testing.T) {
	t.Parallel()
	s, pub := setup(t)
	const shards = 4
	s.Shards = shards
	ids := dueTasks(t, s, 40)
	ctx := context.Background()
	byShard := make([][]string, shards)
	for _, id := range ids {
		doc, err := s.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if k := protocol.Shard(id, shards); doc.DueShard != k {
			t.Fatalf("%s stored in shard %d, want %d", id, doc.DueShard, k)
		}
		byShard[doc.DueShard] = append(byShard[doc.DueShard], id)
	}
	for k, in := range byShard {
		if len(in) == 0 {
			t.Fatalf("no task in shard %d of %d: the test needs every shard", k, shards)
		}
	}
	create(t, s, "legacy", func(*protocol.Task) {})
	if _, err := s.Tasks().Doc("legacy").Update(ctx, []firestore.Update{{Path: "due_shard", Value: firestore.Delete}}); err != nil {
		t.Fatal(err)
	}
	create(t, s, "beyond", func(*protocol.Task) {})
	if _, err := s.Tasks().Doc("beyond").Update(ctx, []firestore.Update{{Path: "due_shard", Value: shards + 3}}); err != nil {
		t.Fatal(err)
	}

	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), shardConfig(shards), "me")
	// Shard 0 first: its strays' pass finds the due documents of the other shards too, and must
	// leave them to their leaders.
	for k := range shards {
		if _, err := sw.passShard(ctx, sw.shards[k]); err != nil {
			t.Fatal(err)
		}
		want := byShard[k]
		if k == 0 {
			want = append(slices.Clone(want), "beyond", "legacy")
			slices.Sort(want)
		}
		if diff := cmp.Diff(want, nudgedTasks(pub)); diff != "" {
			t.Errorf("shard %d's pass nudged (-want +got):\n%s", k, diff)
		}
	}
	for _, id := range []string{"legacy", "beyond"} {
		doc, err := s.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if k := protocol.Shard(id, shards); doc.DueShard != k || doc.Nudges != 1 {
			t.Errorf("stray %s after its nudge: shard %d nudges %d, want shard %d nudges 1", id, doc.DueShard, doc.Nudges, k)
		}
	}
}

// With 4 shards, a second instance that starts while the first leads them all is handed half of
// them; and the due tasks of every shard are nudged by one instance or the other.
func TestShardsSpreadOverInstances(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	const shards = 4
	s.Shards = shards
	cfg := shardConfig(shards)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	run := func(owner string, pub Publisher) chan error {
		done := make(chan error, 1)
		sw := New(s, pub, nil, slog.New(slog.DiscardHandler), cfg, owner)
		go func() { done <- sw.Run(ctx) }()
		return done
	}
	pubA, pubB := &testenv.Publisher{}, &testenv.Publisher{}
	doneA := run("a", pubA)
	waitFor(t, 10*time.Second, "a leads every shard", func() bool {
		return slices.Equal(leaders(t, s, shards), []string{"a", "a", "a", "a"})
	})
	doneB := run("b", pubB)
	var got []string
	waitFor(t, 10*time.Second, "each instance leads two shards", func() bool {
		got = leaders(t, s, shards)
		return slices.Equal(got, []string{"a", "b", "a", "b"})
	})

	ids := dueTasks(t, s, 40)
	var nudgedA, nudgedB []string
	waitFor(t, 10*time.Second, "every task nudged", func() bool {
		nudgedA, nudgedB = append(nudgedA, nudgedTasks(pubA)...), append(nudgedB, nudgedTasks(pubB)...)
		return len(nudgedA)+len(nudgedB) >= len(ids)
	})
	for name, nudged := range map[string][]string{"a": nudgedA, "b": nudgedB} {
		for _, id := range nudged {
			if k := protocol.Shard(id, shards); got[k] != name {
				t.Errorf("%s nudged %s of shard %d, which %s leads", name, id, k, got[k])
			}
		}
	}
	all := slices.Sorted(slices.Values(append(slices.Clone(nudgedA), nudgedB...)))
	if diff := cmp.Diff(ids, all); diff != "" {
		t.Errorf("nudged (-want +got):\n%s", diff)
	}
	stop()
	for _, done := range []chan error{doneA, doneB} {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// An instance killed while it leads shards (its leases and its membership left to expire) has
// them taken over by the one left, which then nudges their due tasks.
func TestKilledLeadersShardsAreTakenOver(t *testing.T) {
	t.Parallel()
	project := emulator.ProjectID(t)
	s := store.New(testenv.Firestore(t, project))
	s.Shards = 4
	dying := store.New(testenv.Firestore(t, project))
	const shards = 4
	cfg := shardConfig(shards)
	pubA, pubB := &testenv.Publisher{}, &testenv.Publisher{}
	ctxA, killA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() { doneA <- New(dying, pubA, nil, slog.New(slog.DiscardHandler), cfg, "a").Run(ctxA) }()
	waitFor(t, 10*time.Second, "a leads every shard", func() bool {
		return slices.Equal(leaders(t, s, shards), []string{"a", "a", "a", "a"})
	})
	ctxB, stopB := context.WithCancel(context.Background())
	doneB := make(chan error, 1)
	go func() { doneB <- New(s, pubB, nil, slog.New(slog.DiscardHandler), cfg, "b").Run(ctxB) }()
	waitFor(t, 10*time.Second, "each instance leads two shards", func() bool {
		return slices.Equal(leaders(t, s, shards), []string{"a", "b", "a", "b"})
	})

	// Killed: its client is gone before it can release a lease or leave the membership.
	if err := dying.FS.Close(); err != nil {
		t.Fatal(err)
	}
	killA()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	if got := leaders(t, s, shards); !slices.Equal(got, []string{"a", "b", "a", "b"}) {
		t.Fatalf("right after the kill the leases are %v, want a's still held until they expire", got)
	}
	killed := time.Now()
	waitFor(t, 10*time.Second, "b leads every shard", func() bool {
		return slices.Equal(leaders(t, s, shards), []string{"b", "b", "b", "b"})
	})
	if took, bound := time.Since(killed), 2*cfg.LeaderTTL; took > bound {
		t.Errorf("takeover took %s, want within the lease and a few ticks (%s)", took, bound)
	}
	ids := dueTasks(t, s, 20)
	nudged := 0
	waitFor(t, 10*time.Second, "every task nudged by b", func() bool { nudged += len(pubB.Take()); return nudged >= len(ids) })
	stopB()
	if err := <-doneB; err != nil {
		t.Error(err)
	}
}

// waitFor polls cond every 20 ms until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
	}
}
