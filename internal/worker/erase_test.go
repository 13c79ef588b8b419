package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

// undeletable is the Files API as a worker that cannot delete copies sees it: its process died
// before the deletion that follows a task's end, or the Files API refused it.
type undeletable struct{ *gemini.Client }

func (undeletable) DeleteFile(context.Context, string) error {
	return errors.New("files.delete: 503 unavailable")
}

func eraseMsg(id string) *bus.Message {
	return &bus.Message{ID: "erase-" + id, Attributes: map[string]string{task.AttrTaskID: id, task.AttrKind: store.KindFileErase}}
}

// Erasing a task lists its Files API copies on the task, due, until a worker has deleted them:
// a copy left behind when the task ended is deleted by the erase's nudge, a failed deletion
// stays listed for the sweeper's next nudge, and once every copy is gone nothing is pending
// (the task's retention TTL starts).
func TestEraseDeletesTheTasksFileCopies(t *testing.T) {
	t.Parallel()
	b := setupFiles(t)
	ctx := context.Background()
	b.task(t, "doc", func(d *protocol.Task) {
		d.CallbackURL = "" // nothing else pending once it ends
		d.Files = []protocol.File{b.put(t, "doc.pdf", "application/pdf", []byte("%PDF-1.7 personal data"))}
	})
	files := Files{Copier: undeletable{b.gen}, Objects: b.objs, Margin: time.Minute}
	stuck := New(b.store, b.gen, cacheable("m"), b.pub, b.log, policy("w1"), WithFiles(files))
	stuck.Handle(ctx, msg("doc"))
	done := b.get(t, "doc")
	if done.State != task.StateSucceeded || done.Files[0].Copy == nil {
		t.Fatalf("state %s, file %+v: want succeeded with its copy recorded", done.State, done.Files[0])
	}
	copyName := done.Files[0].Copy.Name

	erased, _, err := b.store.EraseTask(ctx, "doc", time.Second, func(*protocol.Task) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if erased.FileErase == nil || !cmp.Equal(erased.FileErase.Keys, []string{copyName}) || erased.DueAt == nil || erased.ExpireAt != nil {
		t.Fatalf("erased task: file_erase %+v, due_at %v, expire_at %v; want %s listed and due, no TTL yet", erased.FileErase, erased.DueAt, erased.ExpireAt, copyName)
	}

	stuck.Handle(ctx, eraseMsg("doc"))
	if got := b.get(t, "doc"); got.FileErase == nil || got.DueAt == nil {
		t.Fatalf("a copy that could not be deleted left file_erase %+v, due_at %v: want it still listed and due", got.FileErase, got.DueAt)
	}
	if !live(b, copyName) {
		t.Fatalf("copy %s gone before any deletion succeeded", copyName)
	}

	b.fileHandler(time.Minute).Handle(ctx, eraseMsg("doc"))
	if live(b, copyName) {
		t.Errorf("copy %s still in the Files API after the erase's nudge", copyName)
	}
	got := b.get(t, "doc")
	if got.FileErase != nil || got.DueAt != nil || got.ExpireAt == nil {
		t.Errorf("after the deletion: file_erase %+v, due_at %v, expire_at %v; want nothing pending and the TTL set", got.FileErase, got.DueAt, got.ExpireAt)
	}
	if got.State != task.StateSucceeded || got.Output != "" {
		t.Errorf("the erase nudge changed the task: %s, output %q", got.State, got.Output)
	}
}

// live reports whether the fake's Files API still serves the copy name.
func live(b *fileBundle, name string) bool {
	for _, f := range b.srv.Files() {
		if f.Name == name && !f.Deleted {
			return true
		}
	}
	return false
}
