package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The store's one way to read a document, to read a query's documents and to change one
// document in a transaction, so each read names what failed and treats a missing document alike.

// readAll decodes every document of it, then stops it; what names the read in its error.
func readAll[T any](it *firestore.DocumentIterator, what string, decode func(*firestore.DocumentSnapshot) (T, error)) ([]T, error) {
	defer it.Stop()
	var out []T
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		v, err := decode(snap)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
}

// getDoc reads and decodes the document at ref, what it is named in errors: ErrNotFound when it
// is missing.
func getDoc[T any](ctx context.Context, ref *firestore.DocumentRef, what string, decode func(*firestore.DocumentSnapshot) (T, error)) (T, error) {
	var zero T
	snap, err := ref.Get(ctx)
	if status.Code(err) == codes.NotFound {
		return zero, fmt.Errorf("get %s %s: %w", what, ref.ID, ErrNotFound)
	}
	if err != nil {
		return zero, fmt.Errorf("get %s %s: %w", what, ref.ID, err)
	}
	return decode(snap)
}

// mutateDoc is the read-modify-write of one document that must exist (ErrNotFound when it does
// not): in a transaction it reads and decodes ref, applies fn and writes back what fn leaves. Like
// MutateFunc, fn may run more than once, and ErrNoChange from it writes nothing and is no error.
// It returns the document as fn left it.
func mutateDoc[T any](ctx context.Context, s *Store, ref *firestore.DocumentRef, decode func(*firestore.DocumentSnapshot) (T, error), fn func(v T, now time.Time) error) (T, error) {
	var out, zero T
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		snap, err := tx.Get(ref)
		if status.Code(err) == codes.NotFound {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if out, err = decode(snap); err != nil {
			return err
		}
		if err := fn(out, s.now()); err != nil {
			return err
		}
		return tx.Set(ref, out)
	}, s.txOptions()...)
	if err != nil && !errors.Is(err, ErrNoChange) {
		return zero, err
	}
	return out, nil
}

// txReadIfExists reads ref in tx and decodes it into v, what it is named in errors. A missing
// document leaves v as it is and reports false: the caller creates it.
func txReadIfExists(tx *firestore.Transaction, ref *firestore.DocumentRef, what string, v any) (bool, error) {
	snap, err := tx.Get(ref)
	if status.Code(err) == codes.NotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := snap.DataTo(v); err != nil {
		return false, fmt.Errorf("decode %s %s: %w", what, ref.ID, err)
	}
	return true, nil
}
