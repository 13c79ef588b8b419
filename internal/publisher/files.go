package publisher

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Objects reads the Cloud Storage objects tasks name, signs upload URLs and deletes uploads
// (objects.Client).
type Objects interface {
	Attrs(ctx context.Context, bucket, object string) (objects.Attrs, error)
	SignPut(bucket, object, mimeType string, size int64, expires time.Time) (string, map[string]string, error)
	Delete(ctx context.Context, bucket, object string) error
}

var _ Objects = (*objects.Client)(nil)

// UploadURLTTL is how long a signed upload URL works.
const UploadURLTTL = 15 * time.Minute

// probFileForbidden: a task named an object its tenant may not read.
const probFileForbidden = "file-forbidden"

// uploadPrefix is where a tenant's uploads live in the input bucket: uploads/{tenant}/{id}.
func uploadObject(tenant, id string) string { return "uploads/" + tenant + "/" + id }

// checkFiles refuses the files of req that its family cannot take, before any object is read.
func (v validator) checkFiles(req *task.Request, fam *prompts.Variant, bad func(field, format string, args ...any)) {
	if len(req.Files) == 0 {
		if fam != nil && fam.Files != nil && fam.Files.Required {
			bad("files", "family %q reads files; name at least one", req.Family)
		}
		return
	}
	if fam != nil && fam.Files == nil {
		bad("files", "family %q takes no files", req.Family)
		return
	}
	limit := v.maxFiles
	if fam != nil {
		limit = min(limit, fam.Files.Max)
	}
	if len(req.Files) > limit {
		bad("files", "at most %d files", limit)
	}
	for i, f := range req.Files {
		field := "files[" + strconv.Itoa(i) + "]"
		switch {
		case (f.URI == "") == (f.UploadID == ""):
			bad(field, "name either uri or upload_id")
		case f.URI != "":
			if _, _, err := objects.ParseURI(f.URI); err != nil {
				bad(field+".uri", "must be gs://bucket/object")
			}
		case len(f.UploadID) != 32 || strings.Trim(f.UploadID, "0123456789abcdef") != "":
			bad(field+".upload_id", "is not an upload id")
		}
		if f.MIMEType != "" && fam != nil && !fam.Files.Accepts(f.MIMEType) {
			bad(field+".mime_type", "family %q does not take %s (it takes %s)", req.Family, f.MIMEType, strings.Join(fam.Files.Accept, ", "))
		}
	}
}

// resolveFiles reads each file of req and records the generation, size and checksums its calls
// will read. A file the tenant may not read — another tenant's upload, a bucket an admin has not
// allowed it — is a 403 naming it; one that is missing, of a type the family does not take, over
// the size limit or unlike what its upload declared is a 400. Nothing is created or paid before.
func (s *Server) resolveFiles(ctx context.Context, tenant string, req *task.Request, fam *prompts.Variant) ([]protocol.File, error) {
	if len(req.Files) == 0 {
		return nil, nil
	}
	if s.objects == nil {
		return nil, fieldProblem("files", "this deployment reads no files (no storage configured)")
	}
	var allowed []string
	out := make([]protocol.File, 0, len(req.Files))
	for i, f := range req.Files {
		field := "files[" + strconv.Itoa(i) + "]"
		if f.UploadID != "" {
			sf, err := s.resolveUpload(ctx, tenant, field, f, fam)
			if err != nil {
				return nil, err
			}
			out = append(out, sf)
			continue
		}
		bucket, object, _ := objects.ParseURI(f.URI) // checked by checkFiles
		if allowed == nil {
			t, err := s.st.GetTenant(ctx, tenant)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, fmt.Errorf("tenant limits: %w", err)
			}
			allowed = []string{}
			if err == nil {
				allowed = t.Limits.AllowedBuckets
			}
		}
		if bucket == s.cfg.InputBucket || !slices.Contains(allowed, bucket) {
			return nil, forbiddenFile(field+".uri", "bucket %s is not allowed for this tenant (an admin allows buckets in the tenant's limits; uploads are named by upload_id)", bucket)
		}
		a, err := s.objects.Attrs(ctx, bucket, object)
		if errors.Is(err, objects.ErrNotFound) {
			return nil, fieldProblem(field+".uri", "%s does not exist", f.URI)
		}
		if err != nil {
			return nil, err
		}
		mimeType := f.MIMEType
		if mimeType == "" {
			mimeType = a.ContentType
		}
		if err := s.checkObject(field+".uri", a, mimeType, fam); err != nil {
			return nil, err
		}
		out = append(out, protocol.FileOf(bucket, object, a.Generation, a.Size, a.CRC32C, a.MD5, mediaType(mimeType), ""))
	}
	return out, nil
}

func (s *Server) resolveUpload(ctx context.Context, tenant, field string, f task.File, fam *prompts.Variant) (protocol.File, error) {
	u, err := s.st.GetUpload(ctx, f.UploadID)
	if errors.Is(err, store.ErrNotFound) || err == nil && u.Tenant != tenant {
		// Another tenant's upload looks like none: its existence is not disclosed.
		return protocol.File{}, forbiddenFile(field+".upload_id", "is not an upload of this tenant")
	}
	if err != nil {
		return protocol.File{}, err
	}
	if f.MIMEType != "" && mediaType(f.MIMEType) != mediaType(u.MIMEType) {
		return protocol.File{}, fieldProblem(field+".mime_type", "the upload was declared %s", u.MIMEType)
	}
	a, err := s.objects.Attrs(ctx, u.Bucket, u.Object)
	if errors.Is(err, objects.ErrNotFound) {
		return protocol.File{}, fieldProblem(field+".upload_id", "nothing was uploaded yet (PUT the file to the upload's url first)")
	}
	if err != nil {
		return protocol.File{}, err
	}
	switch {
	case mediaType(a.ContentType) != mediaType(u.MIMEType):
		return protocol.File{}, fieldProblem(field+".upload_id", "the object's content type %s is not the %s the upload declared", a.ContentType, u.MIMEType)
	case a.Size > u.Size:
		return protocol.File{}, fieldProblem(field+".upload_id", "the object's %d bytes exceed the %d the upload declared", a.Size, u.Size)
	}
	if err := s.checkObject(field+".upload_id", a, u.MIMEType, fam); err != nil {
		return protocol.File{}, err
	}
	return protocol.FileOf(u.Bucket, u.Object, a.Generation, a.Size, a.CRC32C, a.MD5, mediaType(u.MIMEType), u.ID), nil
}

// checkObject refuses an object the family cannot take or over the size limit.
func (s *Server) checkObject(field string, a objects.Attrs, mimeType string, fam *prompts.Variant) error {
	switch {
	case mimeType == "":
		return fieldProblem(field, "the object has no content type; give mime_type")
	case fam != nil && !fam.Files.Accepts(mimeType):
		return fieldProblem(field, "family %q does not take %s (it takes %s)", fam.Family, mimeType, strings.Join(fam.Files.Accept, ", "))
	case a.Size > s.cfg.MaxFileBytes:
		return fieldProblem(field, "is %d bytes; at most %d are accepted", a.Size, s.cfg.MaxFileBytes)
	case a.Size == 0:
		return fieldProblem(field, "is empty")
	}
	return nil
}

// forbiddenFile is a 403 naming the file a tenant may not read.
func forbiddenFile(field, format string, args ...any) error {
	d := fmt.Sprintf(format, args...)
	return httpapi.Problem(http.StatusForbidden, probFileForbidden, field+": "+d, task.FieldError{Field: field, Detail: d})
}

// mediaType is mimeType without parameters, lower-cased; mimeType itself when it does not parse.
func mediaType(mimeType string) string {
	mt, _, err := mime.ParseMediaType(mimeType)
	if err != nil {
		return mimeType
	}
	return mt
}

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request, tenant string) error {
	if s.objects == nil || s.cfg.InputBucket == "" {
		return httpapi.Problem(http.StatusNotImplemented, httpapi.TypeInvalid, "this deployment takes no uploads (no input bucket configured)")
	}
	if err := s.take(r.Context(), tenant); err != nil {
		return err
	}
	var req task.UploadRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	if mt, _, err := mime.ParseMediaType(req.MIMEType); err != nil || !strings.Contains(mt, "/") {
		return fieldProblem("mime_type", "must be a MIME type such as application/pdf")
	}
	if req.Size < 1 || req.Size > s.cfg.MaxFileBytes {
		return fieldProblem("size", "must be 1 to %d bytes", s.cfg.MaxFileBytes)
	}
	now := s.now()
	id := randomID()
	u := &store.Upload{ID: id, Tenant: tenant, Bucket: s.cfg.InputBucket, Object: uploadObject(tenant, id), MIMEType: req.MIMEType,
		Size: req.Size, CreatedAt: now, URLExpiresAt: now.Add(UploadURLTTL), ExpireAt: now.Add(s.cfg.UploadRetention)}
	url, headers, err := s.objects.SignPut(u.Bucket, u.Object, u.MIMEType, u.Size, u.URLExpiresAt)
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(r.Context())
	defer cancel()
	if err := s.st.CreateUpload(ctx, u); err != nil {
		return err
	}
	httpapi.JSON(w, http.StatusCreated, "application/json", task.Upload{UploadID: id, URL: url, Method: http.MethodPut, Headers: headers, ExpiresAt: u.URLExpiresAt})
	return nil
}

// nudgeCopyErase asks a worker to delete the Files API copies t's erase listed: the publisher
// holds no Gemini credentials. If the nudge is lost, the sweeper sends it after NudgeGrace.
func (s *Server) nudgeCopyErase(ctx context.Context, t *protocol.Task) {
	ctx, cancel := context.WithTimeout(obs.WithTask(context.WithoutCancel(ctx), t.ID), s.cfg.PublishTimeout)
	defer cancel()
	attrs := map[string]string{task.AttrTaskID: t.ID, task.AttrTenant: t.Tenant, task.AttrKind: store.KindFileErase}
	if _, err := s.pub.Publish(ctx, bus.TopicTasks, nil, attrs); err != nil {
		s.log.WarnContext(ctx, "file erase nudge not published; the sweeper will nudge", "task_id", t.ID, "error", err)
	}
}

// eraseUploads deletes the genbox uploads t read, objects and documents: erasing a task erases
// them for every task that names them.
func (s *Server) eraseUploads(ctx context.Context, t *protocol.Task) error {
	var errs []error
	for _, f := range t.Files {
		if f.UploadID == "" || s.objects == nil {
			continue
		}
		if err := s.objects.Delete(ctx, f.Bucket, f.Object); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := s.st.DeleteUpload(ctx, f.UploadID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
