package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/objects/gcsfake"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

const filesBucket = "genbox-input"

// fileBundle is a worker bundle with Cloud Storage served by the emulator.
type fileBundle struct {
	*bundle
	gcs  *gcsfake.Server
	objs *objects.Client
}

func setupFiles(t *testing.T, fakeOpts ...geminitest.Option) *fileBundle {
	t.Helper()
	return setupFilesWith(t, nil, fakeOpts...)
}

// setupFilesWith is setupFiles with extra Gemini client settings (variable -> value).
func setupFilesWith(t *testing.T, extra map[string]string, fakeOpts ...geminitest.Option) *fileBundle {
	t.Helper()
	project := emulator.ProjectID(t)
	b := setupOn(t, project, testenv.Firestore(t, project), 0, extra, fakeOpts...)
	gcs, err := gcsfake.Start(filesBucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gcs.Close)
	objs, err := gcs.Client(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &fileBundle{bundle: b, gcs: gcs, objs: objs}
}

// put writes data as the object and returns the task file that records its current generation.
func (b *fileBundle) put(t *testing.T, name, mimeType string, data []byte) protocol.File {
	t.Helper()
	b.gcs.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: filesBucket, Name: name, ContentType: mimeType}, Content: data})
	a, err := b.objs.Attrs(context.Background(), filesBucket, name)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.FileOf(filesBucket, name, a.Generation, a.Size, a.CRC32C, a.MD5, mimeType, "")
}

func (b *fileBundle) fileHandler(margin time.Duration, opts ...Option) *Handler {
	opts = append(opts, WithFiles(Files{Copier: b.gen, Objects: b.objs, Margin: margin}))
	return New(b.store, b.gen, cacheable("m"), b.pub, b.log, policy("w1"), opts...)
}

// cacheable renders every task for models, its outputs cacheable.
func cacheable(models ...string) fakeRenderer {
	return fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{Prompt: input, Models: models, CacheAllowed: true, Version: "1"}, nil
	}}
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// readBy lists the digests of the files each billed generation read, in order.
func readBy(srv *geminitest.Server) [][]string {
	var out [][]string
	for _, bill := range srv.Ledger().Bills {
		var d []string
		for _, f := range bill.Request.Files {
			d = append(d, f.SHA256)
		}
		out = append(out, d)
	}
	return out
}

// A task's file reaches the model byte for byte through one Files API copy, recorded on the
// task and deleted when the task ends.
func TestFileTaskReadsTheRecordedBytes(t *testing.T) {
	t.Parallel()
	b := setupFiles(t)
	ctx := context.Background()
	pdf := []byte("%PDF-1.7 quarterly report, revenue up 3%")
	f := b.put(t, "uploads/tenant-a/doc", "application/pdf", pdf)
	b.task(t, "doc", func(d *protocol.Task) { d.Files = []protocol.File{f} })
	// The object is overwritten after submit: the task still reads the generation it recorded.
	b.put(t, "uploads/tenant-a/doc", "application/pdf", []byte("%PDF-1.7 another document"))

	b.fileHandler(time.Minute).Handle(ctx, msg("doc"))
	got := b.get(t, "doc")
	if got.State != task.StateSucceeded {
		t.Fatalf("state %s (%+v), want succeeded", got.State, got.Error)
	}
	if diff := cmp.Diff([][]string{{sha(pdf)}}, readBy(b.srv)); diff != "" {
		t.Errorf("bytes the model read (-want +got):\n%s", diff)
	}
	if got.Files[0].Copies != 1 || got.Files[0].Copy == nil || got.Usage.DocumentTokens == 0 {
		t.Errorf("file %+v usage %+v: want one copy recorded and document tokens", got.Files[0], got.Usage)
	}
	waitFor(t, "the copy deleted after the task ended", 10*time.Second, func() bool {
		files := b.srv.Files()
		return len(files) == 1 && files[0].Deleted
	})
}

// A copy that expired while its task waited is made again once, before the next call; the
// retries after it reuse the new copy: one new copy, not one per retry.
func TestFileCopyRemadeOnceAfterExpiry(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, geminitest.WithFileTTL(1500*time.Millisecond))
	ctx := context.Background()
	audio := []byte("RIFF....WAVEfmt a short recording")
	b.task(t, "rec", func(d *protocol.Task) { d.Files = []protocol.File{b.put(t, "rec.wav", "audio/wav", audio)} })
	h := b.fileHandler(0)
	due := func() {
		t.Helper()
		if _, err := b.store.MutateTask(ctx, "rec", func(d *protocol.Task, now time.Time) error { d.NotBefore = &now; return nil }); err != nil {
			t.Fatal(err)
		}
	}

	b.srv.FailNext("m", 503, 503)
	h.Handle(ctx, msg("rec"))
	first := b.get(t, "rec")
	if first.State != task.StateQueued || first.Files[0].Copies != 1 {
		t.Fatalf("after a failed call: %s with %d copies, want queued with 1", first.State, first.Files[0].Copies)
	}
	// The task waits past its copy's 48 h (here 1.5 s).
	time.Sleep(time.Until(first.Files[0].Copy.ExpireAt) + 50*time.Millisecond)

	b.srv.FailNext("m", 503, 503)
	due()
	h.Handle(ctx, msg("rec"))
	second := b.get(t, "rec")
	if second.Files[0].Copies != 2 || second.Files[0].Copy.Name == first.Files[0].Copy.Name {
		t.Fatalf("after the expiry: copies %d (%s), want a second copy", second.Files[0].Copies, second.Files[0].Copy.Name)
	}
	due()
	h.Handle(ctx, msg("rec"))
	got := b.get(t, "rec")
	if got.State != task.StateSucceeded || got.Files[0].Copies != 2 || len(b.srv.Files()) != 2 {
		t.Fatalf("state %s, %d copies recorded, %d uploaded: want succeeded with 2 and 2", got.State, got.Files[0].Copies, len(b.srv.Files()))
	}
	if diff := cmp.Diff([][]string{{sha(audio)}}, readBy(b.srv)); diff != "" {
		t.Errorf("bytes the model read (-want +got):\n%s", diff)
	}
	if got.Usage.AudioTokens == 0 {
		t.Errorf("usage %+v: want audio tokens", got.Usage)
	}
}

// cache: true with the same object twice is one call; a new generation of it is a new call.
func TestFileCacheKeyCoversTheGeneration(t *testing.T) {
	t.Parallel()
	b := setupFiles(t)
	ctx := context.Background()
	h := b.fileHandler(time.Minute, WithModelPolicy(ModelPolicy{Estimator: b.gen}))
	v1 := b.put(t, "scan.png", "image/png", []byte("png v1"))
	for _, id := range []string{"c1", "c2"} {
		b.task(t, id, func(d *protocol.Task) { d.Cache, d.Input, d.Files = true, "describe it", []protocol.File{v1} })
		h.Handle(ctx, msg(id))
	}
	if got := b.get(t, "c2"); got.State != task.StateSucceeded || !got.CacheHit {
		t.Fatalf("the same object again: %s cache hit %v, want a cache hit", got.State, got.CacheHit)
	}
	v2 := b.put(t, "scan.png", "image/png", []byte("png v2, another picture"))
	b.task(t, "c3", func(d *protocol.Task) { d.Cache, d.Input, d.Files = true, "describe it", []protocol.File{v2} })
	h.Handle(ctx, msg("c3"))
	if got := b.get(t, "c3"); got.State != task.StateSucceeded || got.CacheHit {
		t.Fatalf("a new generation: %s cache hit %v, want a new call", got.State, got.CacheHit)
	}
	if n := b.srv.Ledger().Total.Generations; n != 2 {
		t.Errorf("%d generations, want 2 (one per generation of the object)", n)
	}
}
