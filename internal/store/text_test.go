package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/safetext"
	"github.com/genbox-dev/genbox/pkg/task"
)

// TestErrorTextIsBounded writes what a model or a receiver can make genbox keep — a model error
// of 3 MiB, a delivery error of 3 MiB quoting a callback URL with its token — and shows the write
// succeeds (unbounded, the document would pass Firestore's 1 MiB and no write of the task could
// ever succeed again), each text at most safetext.MaxError bytes, the token redacted, and the
// event payload frozen from the bounded error.
func TestErrorTextIsBounded(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if err := s.CreateTask(ctx, newTask("big")); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("model says no; ", 3<<20/15)
	_, err := s.MutateTask(ctx, "big", func(t *protocol.Task, now time.Time) error {
		t.Error = &protocol.TaskError{Kind: task.KindPermanent, Code: 400, Message: huge}
		t.Finish(task.StateFailed, now)
		return nil
	})
	if err != nil {
		t.Fatalf("finish with a 3 MiB model error: %v", err)
	}
	delivery := `Post "https://example.com/hook?token=s3cret": ` + huge
	_, err = s.MutateTask(ctx, "big", func(t *protocol.Task, now time.Time) error {
		t.Delivery.LastError = delivery
		t.Delivery.Log = append(t.Delivery.Log, protocol.DeliveryAttempt{EventID: t.Delivery.EventID, At: now, Error: delivery})
		return nil
	})
	if err != nil {
		t.Fatalf("record a 3 MiB delivery error: %v", err)
	}
	got, err := s.GetTask(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{"error.message": got.Error.Message, "delivery.last_error": got.Delivery.LastError,
		"delivery.log[0].error": got.Delivery.Log[0].Error}
	for field, text := range texts {
		if len(text) > safetext.MaxError || !strings.HasSuffix(text, safetext.Ellipsis) {
			t.Errorf("%s: %d bytes ending %q, want at most %d ending in %q", field, len(text), text[max(len(text)-8, 0):], safetext.MaxError, safetext.Ellipsis)
		}
		if strings.Contains(text, "s3cret") {
			t.Errorf("%s keeps the callback token: %q", field, text)
		}
	}
	if n := len(got.Delivery.Payload); n > 4<<10 {
		t.Errorf("the task.failed payload is %d bytes: frozen from the unbounded error", n)
	}
}
