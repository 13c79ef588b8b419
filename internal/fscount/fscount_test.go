package fscount

import (
	"context"
	"errors"
	"os"
	"testing"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"

	"github.com/genbox-dev/genbox/internal/emulator"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// Each kind of operation is counted as the documents it reads or writes.
func TestCountsReadsWritesAndCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var c Counter
	fs, err := c.EmulatorClient(ctx, os.Getenv(emulator.FirestoreHostEnv), emulator.ProjectID(t))
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	col := fs.Collection("docs")
	step := func(name string, want Counts, f func() error) {
		t.Helper()
		before := c.Counts()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := c.Counts().Sub(before); got != want {
			t.Errorf("%s: counted %+v, want %+v", name, got, want)
		}
	}
	step("create two with a bulk writer", Counts{Writes: 2}, func() error {
		b := fs.BulkWriter(ctx)
		_, _ = b.Create(col.Doc("a"), map[string]any{"n": 1})
		_, _ = b.Create(col.Doc("b"), map[string]any{"n": 2})
		b.End()
		return nil
	})
	step("get", Counts{Reads: 1}, func() error { _, err := col.Doc("a").Get(ctx); return err })
	step("query", Counts{Reads: 2}, func() error {
		it := col.Documents(ctx)
		defer it.Stop()
		for {
			if _, err := it.Next(); errors.Is(err, iterator.Done) {
				return nil
			} else if err != nil {
				return err
			}
		}
	})
	step("transaction", Counts{Reads: 1, Writes: 1, Commits: 1}, func() error {
		return fs.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
			if _, err := tx.Get(col.Doc("a")); err != nil {
				return err
			}
			return tx.Set(col.Doc("a"), map[string]any{"n": 3})
		})
	})
}
