package publisher

import (
	"context"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// DELETE lists the task's Files API copies for a worker to delete, on the task (due after the
// nudge grace, so that a lost nudge is sent again by the sweeper), and nudges a worker at once.
// A repeated DELETE nudges again while copies are listed.
func TestDeleteQueuesTheFileCopiesErase(t *testing.T) {
	t.Parallel()
	_, withObjects := withStorage(t)
	e := setup(t, withObjects)
	ctx := context.Background()
	_, res := e.submitUploadedPDF(t)
	if _, err := e.st.MutateTask(ctx, res.TaskID, func(t *protocol.Task, now time.Time) error {
		t.Files[0].Copy = &protocol.FileCopy{Name: "files/gb-copy", URI: "https://gemini.example/v1beta/files/gb-copy", ExpireAt: now.Add(48 * time.Hour)}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.finish(res.TaskID, task.StateSucceeded)
	e.pub.Take()

	for range 2 {
		if err := e.api.Delete(ctx, res.TaskID); err != nil {
			t.Fatal(err)
		}
		var nudges []map[string]string
		for _, m := range e.pub.Take() {
			if m.Topic == bus.TopicTasks {
				nudges = append(nudges, m.Attrs)
			}
		}
		want := []map[string]string{{task.AttrTaskID: res.TaskID, task.AttrTenant: e.tenant, task.AttrKind: store.KindFileErase}}
		if diff := cmp.Diff(want, nudges); diff != "" {
			t.Errorf("gemini-tasks nudges of the erase (-want +got):\n%s", diff)
		}
	}
	got, err := e.st.GetTask(ctx, res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if got.FileErase == nil || !cmp.Equal(got.FileErase.Keys, []string{"files/gb-copy"}) || got.DueAt == nil || got.DueAt.Before(*got.ErasedAt) {
		t.Errorf("file_erase %+v, due_at %v: want the copy listed and due after the grace", got.FileErase, got.DueAt)
	}
}
