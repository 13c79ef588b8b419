package publisher

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/objects/gcsfake"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

const (
	inputBucket  = "genbox-input"
	sharedBucket = "acme-documents"
)

// withStorage serves Cloud Storage from the emulator, with the input bucket and another.
func withStorage(t testing.TB) (*gcsfake.Server, option) {
	t.Helper()
	gcs, err := gcsfake.Start(inputBucket, sharedBucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gcs.Close)
	c, err := gcs.Client(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return gcs, func(cfg *Config, d *Deps) { cfg.InputBucket, d.Objects = inputBucket, c }
}

// apiProblem returns err as the Problem the API answered.
func apiProblem(t *testing.T, err error) *task.Problem {
	t.Helper()
	var p *task.Problem
	if !errors.As(err, &p) {
		t.Fatalf("error %v is not a Problem", err)
	}
	return p
}

var pdf = []byte("%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n")

// A tenant reads its own uploads and the buckets an admin allowed it, nothing else: another
// tenant's upload_id and an unlisted bucket are refused at submit naming the file, before any
// task exists.
func TestFilesWhoseObject(t *testing.T) {
	t.Parallel()
	gcs, withObjects := withStorage(t)
	e := setup(t, withObjects)
	ctx := context.Background()
	_, keyB := e.newTenant("initech", &task.Limits{SubmitRate: 1000, SubmitBurst: 1000})
	b := client.New(e.url, keyB, client.WithRetries(0))

	up, res := e.submitUploadedPDF(t)
	got, err := e.api.Get(ctx, res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Files) != 1 || got.Files[0].Size != int64(len(pdf)) || got.Files[0].Generation == 0 || got.Files[0].UploadID != up.UploadID ||
		!strings.HasPrefix(got.Files[0].URI, "gs://"+inputBucket+"/uploads/acme/") {
		t.Fatalf("task files %+v: want the upload, its size and generation", got.Files)
	}

	gcs.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: sharedBucket, Name: "q3.pdf", ContentType: "application/pdf"}, Content: pdf})
	before := len(e.pub.All())
	for _, tc := range []struct {
		name  string
		file  task.File
		field string
	}{
		{"another tenant's upload", up, "files[0].upload_id"},
		{"an upload that does not exist", task.File{UploadID: strings.Repeat("ab", 16)}, "files[0].upload_id"},
		{"an unlisted bucket", task.File{URI: "gs://" + sharedBucket + "/q3.pdf"}, "files[0].uri"},
		{"the input bucket by uri", task.File{URI: got.Files[0].URI}, "files[0].uri"},
	} {
		_, err := b.Submit(ctx, task.Request{Family: "extract", Files: []task.File{tc.file}})
		p := apiProblem(t, err)
		if p.Status != http.StatusForbidden || !cmp.Equal(fields(*p), []string{tc.field}) {
			t.Errorf("%s: %d %v, want 403 naming %s", tc.name, p.Status, fields(*p), tc.field)
		}
	}
	if list, err := b.List(ctx, client.ListOptions{}); err != nil || len(list.Tasks) != 0 {
		t.Fatalf("tenant B has tasks %+v (%v), want none", list, err)
	}
	if n := len(e.pub.All()) - before; n != 0 {
		t.Fatalf("%d nudges after refused submissions, want 0", n)
	}

	// Once an admin allows the bucket, B reads it, at the generation it holds now.
	if _, err := e.admin.SetLimits(ctx, "initech", task.Limits{SubmitRate: 1000, SubmitBurst: 1000, AllowedBuckets: []string{sharedBucket}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Submit(ctx, task.Request{Family: "extract", Files: []task.File{{URI: "gs://" + sharedBucket + "/q3.pdf"}}}); err != nil {
		t.Fatalf("an allowed bucket: %v", err)
	}
}

// What an upload declared is what a task may read: the emulator does not enforce a signed URL's
// content type or size, so genbox checks the object against the upload at submit.
func TestFilesUploadChecks(t *testing.T) {
	t.Parallel()
	_, withObjects := withStorage(t)
	e := setup(t, withObjects)
	ctx := context.Background()
	put := func(u *task.Upload, contentType string, data []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, u.URL, bytes.NewReader(data))
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	submit := func(f task.File, family string) *task.Problem {
		t.Helper()
		_, err := e.api.Submit(ctx, task.Request{Family: family, Input: "fields: total", Files: []task.File{f}})
		if err == nil {
			return nil
		}
		return apiProblem(t, err)
	}

	u, err := e.api.CreateUpload(ctx, "application/pdf", int64(len(pdf)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(u.URL, "X-Goog-Signature=") || u.Headers[objects.HeaderLengthRange] != "0,"+strconv.Itoa(len(pdf)) || u.Headers[objects.HeaderIfGenerationM] != "0" {
		t.Fatalf("upload %+v: want a V4 signed URL fixing the size range and create-only", u)
	}
	if p := submit(task.File{UploadID: u.UploadID}, "extract"); p == nil || p.Status != 400 || !strings.Contains(p.Detail, "nothing was uploaded") {
		t.Errorf("before the PUT: %v, want 400 nothing uploaded", p)
	}
	put(u, "image/png", pdf)
	if p := submit(task.File{UploadID: u.UploadID}, "extract"); p == nil || p.Status != 400 || !strings.Contains(p.Detail, "content type") {
		t.Errorf("a PUT of another content type: %v, want 400", p)
	}

	big, err := e.api.CreateUpload(ctx, "application/pdf", 10)
	if err != nil {
		t.Fatal(err)
	}
	put(big, "application/pdf", pdf)
	if p := submit(task.File{UploadID: big.UploadID}, "extract"); p == nil || p.Status != 400 || !strings.Contains(p.Detail, "exceed") {
		t.Errorf("a PUT over the declared size: %v, want 400", p)
	}

	ok, err := e.api.Upload(ctx, "application/pdf", pdf)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, family string
		file         task.File
		field        string
	}{
		{"a family without files", "summarize", ok, "files"},
		{"a type the family does not take", "transcribe", ok, "files[0].mime_type"},
		{"an upload of a type the family does not take", "transcribe", task.File{UploadID: ok.UploadID}, "files[0].upload_id"},
		{"a mime_type unlike the upload's", "extract", task.File{UploadID: ok.UploadID, MIMEType: "image/png"}, "files[0].mime_type"},
		{"both uri and upload_id", "extract", task.File{UploadID: ok.UploadID, URI: "gs://b/o"}, "files[0]"},
	} {
		p := submit(tc.file, tc.family)
		if p == nil || p.Status != 400 || !cmp.Equal(fields(*p), []string{tc.field}) {
			t.Errorf("%s: %+v, want 400 naming %s", tc.name, p, tc.field)
		}
	}
	if _, err := e.api.Submit(ctx, task.Request{Family: "extract", Files: make([]task.File, 11)}); err == nil || !strings.Contains(err.Error(), "at most 10 files") {
		t.Errorf("11 files: %v, want at most 10", err)
	}
	if _, err := e.api.Submit(ctx, task.Request{Family: "extract"}); err == nil || !cmp.Equal(fields(*apiProblem(t, err)), []string{"files", "input"}) {
		t.Errorf("no file for a family that requires one: %v", err)
	}
}

// The idempotency hash covers the object's generation: the same request naming the same bytes
// is a replay; after the object changed it is a different request.
func TestFilesIdempotencyCoversTheGeneration(t *testing.T) {
	t.Parallel()
	gcs, withObjects := withStorage(t)
	e := setup(t, withObjects)
	ctx := context.Background()
	if _, err := e.admin.SetLimits(ctx, e.tenant, task.Limits{SubmitRate: 1000, SubmitBurst: 1000, AllowedBuckets: []string{sharedBucket}}); err != nil {
		t.Fatal(err)
	}
	obj := func(data []byte) {
		gcs.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: sharedBucket, Name: "scan.png", ContentType: "image/png"}, Content: data})
	}
	obj([]byte("png v1"))
	req := task.Request{Family: "describe", Files: []task.File{{URI: "gs://" + sharedBucket + "/scan.png"}}}
	first, err := e.api.SubmitWithKey(ctx, "scan-1", req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.api.SubmitWithKey(ctx, "scan-1", req)
	if err != nil || again.TaskID != first.TaskID || !again.Replayed {
		t.Fatalf("the same bytes again: %+v %v, want a replay of %s", again, err, first.TaskID)
	}
	obj([]byte("png v2, another image"))
	_, err = e.api.SubmitWithKey(ctx, "scan-1", req)
	if p := apiProblem(t, err); p.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a new generation under the same key: %d, want 422", p.Status)
	}
}

// submitUploadedPDF uploads pdf as e's tenant and submits an extract task reading it.
func (e *env) submitUploadedPDF(t *testing.T) (task.File, *task.SubmitResponse) {
	t.Helper()
	ctx := context.Background()
	up, err := e.api.Upload(ctx, "application/pdf", pdf)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.api.Submit(ctx, task.Request{Family: "extract", Files: []task.File{up}})
	if err != nil {
		t.Fatal(err)
	}
	return up, res
}

// DELETE erases the task's uploads with it: the object and its upload document.
func TestFilesEraseDeletesUploads(t *testing.T) {
	t.Parallel()
	gcs, withObjects := withStorage(t)
	e := setup(t, withObjects)
	ctx := context.Background()
	up, res := e.submitUploadedPDF(t)
	e.finish(res.TaskID, task.StateSucceeded)
	object := "uploads/" + e.tenant + "/" + up.UploadID
	if _, err := gcs.Fake().GetObject(inputBucket, object); err != nil {
		t.Fatalf("the upload before the erase: %v", err)
	}
	if err := e.api.Delete(ctx, res.TaskID); err != nil {
		t.Fatal(err)
	}
	if _, err := gcs.Fake().GetObject(inputBucket, object); err == nil {
		t.Error("the uploaded object survived the erase")
	}
	if _, err := e.st.GetUpload(ctx, up.UploadID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the upload's document after the erase: %v, want not found", err)
	}
}

// :batch resolves each item's files on its own: a readable file is accepted, another tenant's
// upload refused with its 403, in the same batch.
func TestFilesInABatch(t *testing.T) {
	t.Parallel()
	_, withObjects := withStorage(t)
	e := setup(t, withObjects)
	ctx := context.Background()
	_, keyB := e.newTenant("initech", &task.Limits{SubmitRate: 1000, SubmitBurst: 1000})
	b := client.New(e.url, keyB, client.WithRetries(0))
	mine, err := b.Upload(ctx, "image/png", []byte("png bytes"))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := e.api.Upload(ctx, "image/png", []byte("another png"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.SubmitBatch(ctx, []task.Request{
		{Family: "describe", Files: []task.File{mine}},
		{Family: "describe", Files: []task.File{theirs}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := []int{res.Results[0].Status, res.Results[1].Status}
	if !cmp.Equal(got, []int{http.StatusAccepted, http.StatusForbidden}) || res.Results[1].Problem == nil ||
		!cmp.Equal(fields(*res.Results[1].Problem), []string{"files[0].upload_id"}) {
		t.Fatalf("batch statuses %v (%+v), want 202 and a 403 naming files[0].upload_id", got, res.Results[1].Problem)
	}
}
