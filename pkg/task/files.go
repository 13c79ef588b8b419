package task

import "time"

// File is one file a task reads (Request.Files): an object of a Cloud Storage bucket the tenant
// may read — {"uri": "gs://bucket/object", "mime_type": "application/pdf"} — or an object
// uploaded through POST /v1/uploads — {"upload_id": "…"}. MIMEType defaults to the object's
// content type; the task's family must accept it.
type File struct {
	URI      string `json:"uri,omitempty"`
	MIMEType string `json:"mime_type,omitempty"`
	UploadID string `json:"upload_id,omitempty"`
}

// FileView is a file of a task as the API shows it: the object and the generation its calls
// read, whatever the bucket holds now.
type FileView struct {
	URI        string `json:"uri"`
	MIMEType   string `json:"mime_type"`
	Generation int64  `json:"generation"`
	Size       int64  `json:"size"`
	UploadID   string `json:"upload_id,omitempty"`
}

// UploadRequest is the body of POST /v1/uploads: the content type and size of the one object
// its signed URL may write.
type UploadRequest struct {
	MIMEType string `json:"mime_type"`
	Size     int64  `json:"size"`
}

// Upload is the answer to POST /v1/uploads: PUT the file's bytes to URL before ExpiresAt, with
// the headers Headers names (its content type and size range are part of the signature), then
// name it in a task's files by UploadID.
type Upload struct {
	UploadID  string            `json:"upload_id"`
	URL       string            `json:"url"`
	Method    string            `json:"method"`
	Headers   map[string]string `json:"headers"`
	ExpiresAt time.Time         `json:"expires_at"`
}
