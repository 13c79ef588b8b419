package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/genbox-dev/genbox/pkg/task"
)

// CreateUpload asks for a signed URL to upload one file of mimeType and size bytes; PUT the
// bytes to it with PutUpload, then name the file in a task by the upload id.
func (c *Client) CreateUpload(ctx context.Context, mimeType string, size int64) (*task.Upload, error) {
	var out task.Upload
	if _, err := c.do(ctx, http.MethodPost, "/v1/uploads", "", task.UploadRequest{MIMEType: mimeType, Size: size}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PutUpload sends data to the signed URL of u, with the headers its signature covers. The URL
// is Cloud Storage's, not the publisher's: no API key goes with it.
func (c *Client) PutUpload(ctx context.Context, u *task.Upload, data []byte) error {
	method := u.Method
	if method == "" {
		method = http.MethodPut
	}
	req, err := http.NewRequestWithContext(ctx, method, u.URL, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("genbox: upload %s: %w", u.UploadID, err)
	}
	for k, v := range u.Headers {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("genbox: upload %s: %w", u.UploadID, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("genbox: upload %s: storage answered %d: %s", u.UploadID, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// Upload uploads data as one file of mimeType and returns the task file that names it.
func (c *Client) Upload(ctx context.Context, mimeType string, data []byte) (task.File, error) {
	u, err := c.CreateUpload(ctx, mimeType, int64(len(data)))
	if err != nil {
		return task.File{}, err
	}
	if err := c.PutUpload(ctx, u, data); err != nil {
		return task.File{}, err
	}
	return task.File{UploadID: u.UploadID, MIMEType: mimeType}, nil
}

// mediaTypes are the types of the files Gemini reads that Go's built-in table may not know,
// and that a system's table may name differently.
var mediaTypes = map[string]string{
	".pdf": "application/pdf", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp",
	".heic": "image/heic", ".mp3": "audio/mpeg", ".wav": "audio/wav", ".flac": "audio/flac", ".ogg": "audio/ogg",
	".m4a": "audio/mp4", ".aac": "audio/aac", ".aiff": "audio/aiff", ".mp4": "video/mp4", ".mov": "video/quicktime",
	".webm": "video/webm", ".txt": "text/plain",
}

// MediaType is the MIME type of a file named path, by its extension ("" when unknown).
func MediaType(path string) string {
	ext := strings.ToLower(filepath.Ext(path))
	if mt, ok := mediaTypes[ext]; ok {
		return mt
	}
	mt, _, _ := mime.ParseMediaType(mime.TypeByExtension(ext))
	return mt
}

// UploadFile uploads the file at path, its MIME type taken from its extension (MediaType), and
// returns the task file that names it.
func (c *Client) UploadFile(ctx context.Context, path string) (task.File, error) {
	mimeType := MediaType(path)
	if mimeType == "" {
		return task.File{}, fmt.Errorf("genbox: %s: unknown file type (name it .pdf, .png, .jpg, .mp3, .wav, …)", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return task.File{}, fmt.Errorf("genbox: %w", err)
	}
	return c.Upload(ctx, mimeType, data)
}
