package gemini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"google.golang.org/genai"
)

// FileCopy is a file genbox put in the Gemini Files API for a task: its resource name
// (files/…), the URI requests name it by, and when the Files API deletes it (48 h after it was
// made).
type FileCopy struct {
	Name     string
	URI      string
	ExpireAt time.Time
}

// NeedsCopies reports whether the model reads a task's Cloud Storage objects through copies in
// the Files API (the Gemini API) rather than by their gs:// URIs (Vertex AI).
func (c *Client) NeedsCopies() bool { return c.cfg.Backend != BackendVertex }

// CopyFile puts the size bytes of r, of mimeType, in the Files API as files/name — or, when an
// earlier attempt already made files/name (it crashed before recording it), adopts that file
// without reading r. Names are the caller's: one per copy it means to make, so that a repeated
// CopyFile never makes a second copy.
func (c *Client) CopyFile(ctx context.Context, name, mimeType string, size int64, r io.Reader) (FileCopy, error) {
	if f, err := c.files.Get(ctx, "files/"+name, nil); err == nil && f.State == genai.FileStateActive && f.SizeBytes != nil && *f.SizeBytes == size {
		return copyOf(f), nil
	} else if err != nil && !missing(err) {
		return FileCopy{}, fmt.Errorf("look up files/%s: %w", name, err)
	}
	f, err := c.files.Upload(ctx, r, &genai.UploadFileConfig{Name: name, MIMEType: mimeType})
	if err != nil {
		return FileCopy{}, fmt.Errorf("upload files/%s: %w", name, err)
	}
	return copyOf(f), nil
}

// DeleteFile deletes a copy CopyFile made; one already gone (expired, deleted) is not an error.
func (c *Client) DeleteFile(ctx context.Context, name string) error {
	if _, err := c.files.Delete(ctx, name, nil); err != nil && !missing(err) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// missing reports whether the Files API said a file does not exist (404, or 403 "may not exist").
func missing(err error) bool {
	var apiErr genai.APIError
	return errors.As(err, &apiErr) && (apiErr.Code == http.StatusNotFound || apiErr.Code == http.StatusForbidden)
}

func copyOf(f *genai.File) FileCopy {
	return FileCopy{Name: f.Name, URI: f.URI, ExpireAt: f.ExpirationTime}
}
