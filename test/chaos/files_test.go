package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/objects/gcsfake"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// chaosBucket is the bucket the chaos tenant's file tasks name, served by the storage emulator.
const chaosBucket = "chaos-documents"

// withStorage serves Cloud Storage to the stack's processes (STORAGE_EMULATOR_HOST) and allows
// the chaos tenant the bucket its file tasks name.
func (s *stack) withStorage() *gcsfake.Server {
	s.t.Helper()
	gcs, err := gcsfake.Start(chaosBucket)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(gcs.Close)
	for _, env := range append([]map[string]string{s.env}, s.procEnvs()...) {
		env[objects.EnvEmulatorHost] = gcs.Host()
	}
	limits := store.DefaultLimits()
	limits.AllowedBuckets = []string{chaosBucket}
	if _, err := s.store.SetTenantLimits(context.Background(), "chaos", limits); err != nil {
		s.t.Fatal(err)
	}
	return gcs
}

// procEnvs are the environments the stack's processes start with.
func (s *stack) procEnvs() []map[string]string {
	var out []map[string]string
	for _, p := range s.procs {
		p.mu.Lock()
		out = append(out, p.env)
		p.mu.Unlock()
	}
	return out
}

// submitFiles submits n extract tasks, each reading a PDF of its own from the storage emulator.
func (s *stack) submitFiles(gcs *gcsfake.Server, n int, label string) []submitted {
	s.t.Helper()
	return s.submitEach(n, label, func(marker string) task.Request {
		name := marker + ".pdf"
		gcs.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: chaosBucket, Name: name, ContentType: "application/pdf"},
			Content: []byte("%PDF-1.7 invoice " + marker + " total 1,250.00\n%%EOF\n")})
		return task.Request{Family: "extract", Input: "total (" + marker + ")", CallbackURL: s.recv.URL(),
			Files: []task.File{{URI: objects.URI(chaosBucket, name)}}}
	})
}

// The crash matrix of tasks with files: the worker is SIGKILLed after a file's Files API copy
// was made and before it was recorded, after it was recorded and before the call, and inside
// the paid window; a fresh worker carries every task to its webhook. No task is lost, the extra
// generations are at most one per kill inside the paid window, and each file is copied to the
// Files API once: the worker after a kill between the upload and its record adopts the copy the
// dead one made (its name is derived from the task), and every copy is deleted at the end.
func TestWorkerFileCrashPoints(t *testing.T) {
	t.Parallel()
	s := newStack(t, geminitest.Fixed(scale(600*time.Millisecond, 2*time.Second)), "")
	gcs := s.withStorage()
	s.start(svcPublisher, svcResultHandler, svcDLQNotifier)
	tasks := s.submitFiles(gcs, scale(6, 20), "files")
	extra := s.crashAt(scale(1, 2), append(append([]crashpoint.Point(nil), crashpoint.FilePoints...), crashpoint.MidGenerate, crashpoint.Answered))
	w := s.procs[svcWorker]
	w.configure(s.procEnv("GENBOX_INSTANCE_ID", "fresh"), true)
	w.start(t)
	s.checkInvariants(scale(90*time.Second, 10*time.Minute), extra)

	files := s.fake.Files()
	if len(files) != len(tasks) {
		t.Errorf("%d Files API copies for %d tasks of one file each: want one each, adopted after a kill", len(files), len(tasks))
	}
	// Copies are deleted beside their tasks' ends, not before their webhooks.
	deadline := time.Now().Add(10 * time.Second)
	for _, f := range files {
		for !f.Deleted && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			for _, g := range s.fake.Files() {
				if g.Name == f.Name {
					f = g
				}
			}
		}
		if !f.Deleted {
			t.Errorf("copy %s left in the Files API after its task ended", f.Name)
		}
	}
	for _, sub := range tasks {
		doc, err := s.store.GetTask(context.Background(), sub.id)
		if err != nil {
			t.Fatal(err)
		}
		if doc.Files[0].Copies != 1 {
			t.Errorf("task %s: %d copies recorded, want 1", sub.id, doc.Files[0].Copies)
		}
	}
}
