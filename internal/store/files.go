package store

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// UploadsCollection holds the uploads POST /v1/uploads signed: whose they are and what they
// may hold.
const UploadsCollection = "uploads"

// Upload is the uploads/{upload_id} document: an object of the input bucket a tenant may write
// once through its signed URL, with the content type and the size it declared.
type Upload struct {
	ID        string    `firestore:"-"`
	Tenant    string    `firestore:"tenant"`
	Bucket    string    `firestore:"bucket"`
	Object    string    `firestore:"object"`
	MIMEType  string    `firestore:"mime_type"`
	Size      int64     `firestore:"size"`
	CreatedAt time.Time `firestore:"created_at"`
	// URLExpiresAt is when the signed URL stops working.
	URLExpiresAt time.Time `firestore:"url_expires_at"`
	// ExpireAt is when Firestore's TTL deletes the document, with the bucket's lifecycle rule
	// deleting the object about then.
	ExpireAt time.Time `firestore:"expire_at"`
}

func (s *Store) uploads() *firestore.CollectionRef { return s.FS.Collection(UploadsCollection) }

// CreateUpload writes a new upload; ErrExists when its id is taken.
func (s *Store) CreateUpload(ctx context.Context, u *Upload) error {
	_, err := s.uploads().Doc(u.ID).Create(ctx, u)
	if status.Code(err) == codes.AlreadyExists {
		return fmt.Errorf("create upload %s: %w", u.ID, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create upload %s: %w", u.ID, err)
	}
	return nil
}

// GetUpload reads one upload.
func (s *Store) GetUpload(ctx context.Context, id string) (*Upload, error) {
	return getDoc(ctx, s.uploads().Doc(id), "upload", func(snap *firestore.DocumentSnapshot) (*Upload, error) {
		var u Upload
		if err := snap.DataTo(&u); err != nil {
			return nil, fmt.Errorf("decode upload %s: %w", snap.Ref.ID, err)
		}
		u.ID = snap.Ref.ID
		return &u, nil
	})
}

// DeleteUpload deletes an upload's document (its object is the caller's to delete first).
func (s *Store) DeleteUpload(ctx context.Context, id string) error {
	if _, err := s.uploads().Doc(id).Delete(ctx); err != nil {
		return fmt.Errorf("delete upload %s: %w", id, err)
	}
	return nil
}

// KindFileErase is the kind attribute of a gemini-tasks nudge that asks a worker to delete the
// Files API copies an erased task still lists (Task.FileErase), rather than to claim it.
const KindFileErase = "file_erase"
