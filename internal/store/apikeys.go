package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrRevoked means an API key was revoked.
var ErrRevoked = errors.New("store: api key revoked")

// APIKey is the api_keys/{sha256(key)} document. The key itself is never stored: it is shown once
// when created, and only its hash names the document.
type APIKey struct {
	ID        string     `firestore:"-"` // the hex SHA-256 of the key
	Tenant    string     `firestore:"tenant"`
	Revoked   bool       `firestore:"revoked"`
	CreatedAt time.Time  `firestore:"created_at"`
	RevokedAt *time.Time `firestore:"revoked_at,omitempty"`
}

// APIKeyID returns the id of key's document: its hex SHA-256. Keys carry 256 random bits, so an
// unsalted hash is safe to store and to show as the key's id.
func APIKeyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// APIKeys returns the api_keys collection.
func (s *Store) APIKeys() *firestore.CollectionRef { return s.FS.Collection(APIKeysCollection) }

// CreateAPIKey stores the hash of key for tenant, which must exist.
func (s *Store) CreateAPIKey(ctx context.Context, tenant, key string) (*APIKey, error) {
	k := &APIKey{ID: APIKeyID(key), Tenant: tenant, CreatedAt: s.now()}
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		if _, err := tx.Get(s.Tenants().Doc(tenant)); status.Code(err) == codes.NotFound {
			return fmt.Errorf("tenant %s: %w", tenant, ErrNotFound)
		} else if err != nil {
			return err
		}
		return tx.Create(s.APIKeys().Doc(k.ID), k)
	})
	if status.Code(err) == codes.AlreadyExists {
		return nil, fmt.Errorf("create api key: %w", ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("create api key: %w", err)
	}
	return k, nil
}

// Authenticate returns the tenant of key, reading the key's document: ErrNotFound for an unknown
// key, ErrRevoked for a revoked one.
func (s *Store) Authenticate(ctx context.Context, key string) (string, error) {
	id := APIKeyID(key)
	snap, err := s.APIKeys().Doc(id).Get(ctx)
	if status.Code(err) == codes.NotFound {
		return "", fmt.Errorf("api key: %w", ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("api key: %w", err)
	}
	k, err := decodeAPIKey(snap)
	if err != nil {
		return "", err
	}
	if k.Revoked {
		return "", fmt.Errorf("api key: %w", ErrRevoked)
	}
	return k.Tenant, nil
}

func decodeAPIKey(snap *firestore.DocumentSnapshot) (*APIKey, error) {
	var k APIKey
	if err := snap.DataTo(&k); err != nil {
		return nil, fmt.Errorf("decode api key: %w", err)
	}
	k.ID = snap.Ref.ID
	return &k, nil
}

// RevokeAPIKey marks the key with document id (see APIKeyID) revoked. Revoking twice is not an
// error; an unknown id is ErrNotFound.
func (s *Store) RevokeAPIKey(ctx context.Context, id string) (*APIKey, error) {
	k, err := mutateDoc(ctx, s, s.APIKeys().Doc(id), decodeAPIKey, func(k *APIKey, now time.Time) error {
		if k.Revoked {
			return ErrNoChange
		}
		k.Revoked, k.RevokedAt = true, &now
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("revoke api key %s: %w", id, err)
	}
	return k, nil
}

// WatchRevokedKeys calls revoked with the ids of revoked API keys: first every revoked key, once
// Firestore's listener is current, then each newly revoked key as the listener delivers it. A
// revocation is permanent, so a key once reported stays revoked. It returns when ctx ends
// (ctx's error) or the listener fails.
func (s *Store) WatchRevokedKeys(ctx context.Context, revoked func(ids []string)) error {
	it := s.APIKeys().Where("revoked", "==", true).Snapshots(ctx)
	defer it.Stop()
	for {
		snap, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("watch revoked api keys: %w", err)
		}
		ids := make([]string, 0, len(snap.Changes))
		for _, c := range snap.Changes {
			if c.Kind != firestore.DocumentRemoved {
				ids = append(ids, c.Doc.Ref.ID)
			}
		}
		revoked(ids)
	}
}
