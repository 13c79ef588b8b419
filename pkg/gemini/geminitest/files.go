package geminitest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// FileTTL is how long the Files API keeps an uploaded file: 48 hours.
const FileTTL = 48 * time.Hour

// File is what a generation read of one fileData part: the file's MIME type and a digest of the
// exact bytes the fake holds for it, so tests can tell which bytes reached the model.
type File struct {
	URI      string
	MIMEType string
	Size     int64
	SHA256   string // hex
}

// FileRecord is a file of the fake's Files API, as the ledger shows it.
type FileRecord struct {
	Name     string
	MIMEType string
	Size     int64
	SHA256   string // hex
	Created  time.Time
	Expires  time.Time
	Deleted  bool
}

// storedFile is one files/{id} resource.
type storedFile struct {
	FileRecord
	data []byte
}

// pendingUpload is a resumable upload begun and not finalized.
type pendingUpload struct {
	name, mimeType, displayName string
	data                        []byte
}

// WithFileTTL sets how long uploaded files live (FileTTL by default): a test makes it short to
// see a file expire.
func WithFileTTL(d time.Duration) Option { return func(f *Fake) { f.fileTTL = d } }

// Files returns every file ever uploaded, in upload order.
func (f *Fake) Files() []FileRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]FileRecord, 0, len(f.files))
	for _, sf := range f.files {
		out = append(out, sf.FileRecord)
	}
	return out
}

func (f *Fake) routeFiles() {
	f.mux.HandleFunc("POST /upload/v1beta/files", f.authorized(f.uploadFile))
	f.mux.HandleFunc("GET /{version}/files/{id}", f.authorized(f.getFile))
	f.mux.HandleFunc("DELETE /{version}/files/{id}", f.authorized(f.deleteFile))
}

var fileIDRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$`)

// uploadFile serves the Files API's resumable upload as the genai SDK drives it: a start
// command with the file's metadata answered with an upload URL, then chunks posted to that URL,
// the last with "upload, finalize".
func (f *Fake) uploadFile(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Goog-Upload-Protocol") == "resumable" && r.Header.Get("X-Goog-Upload-Command") == "start" {
		f.startUpload(w, r)
		return
	}
	id := r.URL.Query().Get("upload_id")
	f.mu.Lock()
	up, ok := f.uploads[id]
	f.mu.Unlock()
	if !ok {
		f.writeError(w, apiFailure{code: http.StatusNotFound, message: "No such upload."})
		return
	}
	cmd := r.Header.Get("X-Goog-Upload-Command")
	off, err := strconv.Atoi(r.Header.Get("X-Goog-Upload-Offset"))
	body, ok := f.readBody(w, r)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil || off != len(up.data) {
		w.Header().Set("X-Goog-Upload-Status", "cancelled")
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("Upload offset %q does not match the %d bytes received.", r.Header.Get("X-Goog-Upload-Offset"), len(up.data))})
		return
	}
	up.data = append(up.data, body...)
	if !strings.Contains(cmd, "finalize") {
		w.Header().Set("X-Goog-Upload-Status", "active")
		writeJSON(w, http.StatusOK, map[string]any{})
		return
	}
	delete(f.uploads, id)
	now := time.Now()
	sum := sha256.Sum256(up.data)
	sf := &storedFile{FileRecord: FileRecord{Name: up.name, MIMEType: up.mimeType, Size: int64(len(up.data)), SHA256: hex.EncodeToString(sum[:]),
		Created: now, Expires: now.Add(f.fileTTL)}, data: up.data}
	f.files = append(f.files, sf)
	w.Header().Set("X-Goog-Upload-Status", "final")
	writeJSON(w, http.StatusOK, map[string]any{"file": f.fileJSON(r, sf)})
}

func (f *Fake) startUpload(w http.ResponseWriter, r *http.Request) {
	body, ok := f.readBody(w, r)
	if !ok {
		return
	}
	var in struct {
		File struct {
			Name        string `json:"name"`
			MIMEType    string `json:"mimeType"`
			DisplayName string `json:"displayName"`
		} `json:"file"`
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, &in); err != nil {
			f.writeError(w, apiFailure{code: http.StatusBadRequest, message: "Invalid JSON payload received. " + err.Error()})
			return
		}
	}
	mimeType := in.File.MIMEType
	if mimeType == "" {
		mimeType = r.Header.Get("X-Goog-Upload-Header-Content-Type")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	name := in.File.Name
	if name == "" {
		f.ids++
		name = fmt.Sprintf("files/fake%06d", f.ids)
	}
	id := strings.TrimPrefix(name, "files/")
	if !strings.HasPrefix(name, "files/") || !fileIDRE.MatchString(id) {
		f.writeError(w, apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("* File.name: %q is not files/ followed by up to 40 lower-case letters, digits or dashes", name)})
		return
	}
	if sf := f.file(id, time.Now()); sf != nil {
		f.writeError(w, apiFailure{code: http.StatusConflict, message: fmt.Sprintf("File %s already exists.", name)})
		return
	}
	f.ids++
	uploadID := fmt.Sprintf("up%06d", f.ids)
	f.uploads[uploadID] = &pendingUpload{name: name, mimeType: mimeType, displayName: in.File.DisplayName}
	w.Header().Set("X-Goog-Upload-URL", baseURL(r)+"/upload/v1beta/files?upload_id="+uploadID)
	w.Header().Set("X-Goog-Upload-Status", "active")
	writeJSON(w, http.StatusOK, map[string]any{})
}

// file returns the live (not deleted, not expired) file id at now; the caller holds f.mu.
func (f *Fake) file(id string, now time.Time) *storedFile {
	for _, sf := range f.files {
		if sf.Name == "files/"+id && !sf.Deleted && now.Before(sf.Expires) {
			return sf
		}
	}
	return nil
}

func (f *Fake) getFile(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	sf := f.file(r.PathValue("id"), time.Now())
	f.mu.Unlock()
	if sf == nil {
		f.writeError(w, fileMissing("files/"+r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, f.fileJSON(r, sf))
}

// FailFileDeletes makes the next n files.delete calls fail with 503 UNAVAILABLE, leaving their
// files in place: what a worker that died before its delete leaves behind too.
func (f *Fake) FailFileDeletes(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failDeletes = n
}

func (f *Fake) deleteFile(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	if f.failDeletes > 0 {
		f.failDeletes--
		f.mu.Unlock()
		f.writeError(w, apiFailure{code: http.StatusServiceUnavailable, message: "The service is currently unavailable."})
		return
	}
	sf := f.file(r.PathValue("id"), time.Now())
	if sf != nil {
		sf.Deleted = true
	}
	f.mu.Unlock()
	if sf == nil {
		f.writeError(w, fileMissing("files/"+r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

// fileMissing is the Files API's answer for a file that does not exist, or no longer does.
func fileMissing(name string) apiFailure {
	return apiFailure{code: http.StatusForbidden, message: fmt.Sprintf("You do not have permission to access the File %s or it may not exist.", strings.TrimPrefix(name, "files/"))}
}

// fileJSON is a File resource as the Files API answers it.
func (f *Fake) fileJSON(r *http.Request, sf *storedFile) map[string]any {
	sum, _ := hex.DecodeString(sf.SHA256)
	return map[string]any{
		"name":           sf.Name,
		"mimeType":       sf.MIMEType,
		"sizeBytes":      strconv.FormatInt(sf.Size, 10),
		"createTime":     sf.Created.UTC().Format(time.RFC3339Nano),
		"updateTime":     sf.Created.UTC().Format(time.RFC3339Nano),
		"expirationTime": sf.Expires.UTC().Format(time.RFC3339Nano),
		"sha256Hash":     base64.StdEncoding.EncodeToString([]byte(hex.EncodeToString(sum))),
		"uri":            baseURL(r) + "/v1beta/" + sf.Name,
		"state":          "ACTIVE",
		"source":         "UPLOADED",
	}
}

// baseURL is the scheme and host the request came to.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// attachFiles reads the bytes of every fileData part of req from the fake's Files API: a file
// that does not exist (or expired, or was deleted) fails the call as the API does.
func (f *Fake) attachFiles(req *Request, now time.Time) *apiFailure {
	if len(req.fileRefs) == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	files, fail := f.readFiles(req.fileRefs, now)
	if fail != nil {
		return fail
	}
	req.Files = append(req.Files, files...)
	req.fileTokens = fileTokensOf(files)
	return nil
}

// readFiles reads the files that fileData parts name from the fake's Files API, under the lock.
func (f *Fake) readFiles(refs []wireFileData, now time.Time) ([]File, *apiFailure) {
	var out []File
	for _, ref := range refs {
		i := strings.LastIndex(ref.FileURI, "/files/")
		if i < 0 {
			return nil, &apiFailure{code: http.StatusBadRequest, message: fmt.Sprintf("* GenerateContentRequest.contents.parts.file_data.file_uri: the fake reads only Files API URIs, not %q", ref.FileURI)}
		}
		sf := f.file(ref.FileURI[i+len("/files/"):], now)
		if sf == nil {
			fail := fileMissing(ref.FileURI[i+1:])
			return nil, &fail
		}
		out = append(out, File{URI: ref.FileURI, MIMEType: ref.MIMEType, Size: sf.Size, SHA256: sf.SHA256})
	}
	return out, nil
}

// fileTokensOf counts the tokens of files by modality, deterministically: 258 per image, one per
// 32 bytes of anything else.
func fileTokensOf(files []File) map[string]int64 {
	out := map[string]int64{}
	for _, fl := range files {
		switch m := modalityOf(fl.MIMEType); m {
		case "IMAGE":
			out[m] += 258
		default:
			out[m] += max(1, fl.Size/32)
		}
	}
	return out
}

func modalityOf(mimeType string) string {
	switch {
	case strings.HasPrefix(mimeType, "image/"):
		return "IMAGE"
	case strings.HasPrefix(mimeType, "audio/"):
		return "AUDIO"
	case strings.HasPrefix(mimeType, "video/"):
		return "VIDEO"
	case mimeType == "application/pdf":
		return "DOCUMENT"
	}
	return "TEXT"
}
