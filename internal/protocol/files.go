package protocol

import (
	"encoding/hex"
	"slices"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

// File is one input file of a task, recorded when it was submitted: the object and the
// generation every call of the task reads (its retries, fallbacks, batch and Regenerate), with
// its size and checksums, never its bytes. Copy is the task's copy of it in the Gemini Files
// API, when the backend needs one.
type File struct {
	Bucket     string `firestore:"bucket"`
	Object     string `firestore:"object"`
	Generation int64  `firestore:"generation"`
	Size       int64  `firestore:"size"`
	CRC32C     int64  `firestore:"crc32c"`
	MD5        string `firestore:"md5,omitempty"` // hex; composite objects have none
	MIMEType   string `firestore:"mime_type"`
	// UploadID is set when the file is a genbox upload: erased with the task.
	UploadID string    `firestore:"upload_id,omitempty"`
	Copy     *FileCopy `firestore:"copy,omitempty"`
	// Copies counts the Files API copies made of the file; it names the next one.
	Copies int `firestore:"copies,omitempty"`
}

// FileCopy is a copy of a task's file in the Gemini Files API: its resource name (files/…),
// the URI a request names it by, and when the Files API deletes it.
type FileCopy struct {
	Name     string    `firestore:"name"`
	URI      string    `firestore:"uri"`
	ExpireAt time.Time `firestore:"expire_at"`
	// Replay is the replay it was made for: the copies of a replay are deleted when it ends.
	Replay int `firestore:"replay"`
}

// URI is the file's gs://bucket/object.
func (f File) URI() string { return "gs://" + f.Bucket + "/" + f.Object }

// Key identifies the bytes the file holds: object, generation, size, checksums and MIME type.
// The output cache and the idempotency hash cover it, so a new generation is a new request.
func (f File) Key() string {
	return f.URI() + "#" + strconv.FormatInt(f.Generation, 10) + ";size=" + strconv.FormatInt(f.Size, 10) +
		";crc32c=" + strconv.FormatInt(f.CRC32C, 10) + ";md5=" + f.MD5 + ";mime=" + f.MIMEType
}

// FileOf records the object attributes a task's file resolved to.
func FileOf(bucket, object string, generation, size int64, crc32c uint32, md5 []byte, mimeType, uploadID string) File {
	return File{Bucket: bucket, Object: object, Generation: generation, Size: size, CRC32C: int64(crc32c),
		MD5: hex.EncodeToString(md5), MIMEType: mimeType, UploadID: uploadID}
}

// fileViews is how the API shows a task's files.
func fileViews(fs []File) []task.FileView {
	if len(fs) == 0 {
		return nil
	}
	out := make([]task.FileView, len(fs))
	for i, f := range fs {
		out[i] = task.FileView{URI: f.URI(), MIMEType: f.MIMEType, Generation: f.Generation, Size: f.Size, UploadID: f.UploadID}
	}
	return out
}

// modelFiles are a task's files as its model request names them: by gs:// URI, with their keys.
// A backend that cannot read Cloud Storage replaces the URIs with its copies' (the worker).
func modelFiles(fs []File) []gemini.File {
	if len(fs) == 0 {
		return nil
	}
	out := make([]gemini.File, len(fs))
	for i, f := range fs {
		out[i] = gemini.File{URI: f.URI(), MIMEType: f.MIMEType, Size: f.Size, Key: f.Key()}
	}
	return out
}

// QueueCopyErase lists the Files API copies recorded on t for a worker to delete, no earlier
// than at (the sweeper's nudge; the eraser nudges at once). Only a worker holds the Gemini
// credentials; the list is on the task, so its due_at carries the deletion through any crash
// until every copy is gone. A copy the worker already deleted when the task ended is listed
// too: deleting it again is a no-op.
func (t *Task) QueueCopyErase(at time.Time) {
	for _, f := range t.Files {
		if f.Copy == nil {
			continue
		}
		if t.FileErase == nil {
			t.FileErase = &Pending{}
		}
		if !slices.Contains(t.FileErase.Keys, f.Copy.Name) {
			t.FileErase.Keys = append(t.FileErase.Keys, f.Copy.Name)
		}
	}
	if t.FileErase != nil {
		t.FileErase.NextAttemptAt = &at
	}
}

// CopiesErased removes the copies deleted from t's list; an empty list is cleared.
func (t *Task) CopiesErased(deleted []string) {
	if t.FileErase == nil {
		return
	}
	t.FileErase.Keys = slices.DeleteFunc(t.FileErase.Keys, func(n string) bool { return slices.Contains(deleted, n) })
	if len(t.FileErase.Keys) == 0 {
		t.FileErase = nil
	}
}
