package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/objects"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

// FileCopier makes and deletes the Gemini Files API copies of a task's files (gemini.Client).
type FileCopier interface {
	NeedsCopies() bool
	CopyFile(ctx context.Context, name, mimeType string, size int64, r io.Reader) (gemini.FileCopy, error)
	DeleteFile(ctx context.Context, name string) error
}

// ObjectReader reads the objects tasks name at the generation their task recorded
// (objects.Client).
type ObjectReader interface {
	Attrs(ctx context.Context, bucket, object string) (objects.Attrs, error)
	Open(ctx context.Context, bucket, object string, generation int64) (io.ReadCloser, error)
}

var (
	_ FileCopier   = (*gemini.Client)(nil)
	_ ObjectReader = (*objects.Client)(nil)
)

// Files is how the handler brings a task's files to the model: Copier for the Files API, Objects
// for Cloud Storage. Margin is how long a copy must still live for a call to use it (a batch
// job's wait is added to it); a copy closer to its expiry is made again.
type Files struct {
	Copier  FileCopier
	Objects ObjectReader
	Margin  time.Duration
}

// DefaultCopyMargin is how long a Files API copy must still live for a call to use it: a call,
// its retries within one attempt and the commit fit well within it.
const DefaultCopyMargin = time.Hour

// WithFiles lets the handler run tasks that read files; without it they fail permanently.
func WithFiles(f Files) Option { return func(h *Handler) { h.files = f } }

// errFileGone marks a file whose recorded generation can no longer be read: no attempt can
// succeed.
var errFileGone = errors.New("worker: a file of the task is gone or changed since it was submitted")

// copyName is the Files API name of copy n of file i of t's current replay: the same on every
// worker, so that a copy made by a worker that died before recording it is found and adopted
// (gemini.Client.CopyFile) instead of made twice. 35 characters: the API allows 40.
func copyName(t *protocol.Task, i, n int) string {
	f := t.Files[i]
	sum := sha256.Sum256([]byte(t.ID + "\x00" + strconv.Itoa(t.Replay) + "\x00" + strconv.Itoa(i) + "\x00" +
		strconv.FormatInt(f.Generation, 10) + "\x00" + strconv.Itoa(n)))
	return "gb-" + hex.EncodeToString(sum[:16])
}

// usable reports whether f's copy serves a call of replay made at now, waiting at most wait.
func (h *Handler) usable(f protocol.File, replay int, now time.Time, wait time.Duration) bool {
	c := f.Copy
	return c != nil && c.Replay == replay && now.Add(h.files.Margin+wait).Before(c.ExpireAt)
}

// prepareFiles readies t's files for a call that may wait up to wait (a batch job's), and
// returns req naming them as the model reads them. On Vertex AI that is their gs:// URIs,
// after checking each object still holds its recorded generation. On the Gemini API each file
// needs a live copy in the Files API: made once per task and kept on the task, made again only
// when it would expire first (a task parked past 48 h) — never once per retry. Each new copy is
// recorded (fenced) before the call, and kept in last when given (the document the output's
// commit is conditioned on). It returns false when it wrote the task's outcome instead: failed
// (a file is gone), handed back (Cloud Storage or the Files API failed), or lost.
func (r *run) prepareFiles(ctx context.Context, req gemini.Request, wait time.Duration, last *lastWrite) (gemini.Request, bool) {
	t := r.task
	if len(t.Files) == 0 {
		return req, true
	}
	err := r.readyFiles(ctx, wait, last)
	switch {
	case errors.Is(err, errLeaseLost):
		return req, false
	case errors.Is(err, errFileGone):
		r.fail(ctx, &protocol.TaskError{Kind: task.KindPermanent, Message: err.Error()})
		return req, false
	case err != nil:
		r.retry(ctx, err)
		return req, false
	}
	return r.h.withCopies(t, req), true
}

// withCopies is req naming t's files by their Files API copies where the model reads copies and
// t has recorded them.
func (h *Handler) withCopies(t *protocol.Task, req gemini.Request) gemini.Request {
	if h.files.Copier == nil || !h.files.Copier.NeedsCopies() || len(req.Files) != len(t.Files) {
		return req
	}
	req.Files = append([]gemini.File(nil), req.Files...)
	for i, f := range t.Files {
		if f.Copy != nil && f.Copy.Replay == t.Replay {
			req.Files[i].URI = f.Copy.URI
		}
	}
	return req
}

// errLeaseLost: a fenced write found the task no longer mine.
var errLeaseLost = errors.New("worker: the lease is no longer mine")

func (r *run) readyFiles(ctx context.Context, wait time.Duration, last *lastWrite) error {
	h, t := r.h, r.task
	if h.files.Copier == nil || h.files.Objects == nil {
		return fmt.Errorf("%w: this worker reads no files (no storage configured)", errFileGone)
	}
	if !h.files.Copier.NeedsCopies() {
		for _, f := range t.Files {
			a, err := h.files.Objects.Attrs(ctx, f.Bucket, f.Object)
			if errors.Is(err, objects.ErrNotFound) || err == nil && a.Generation != f.Generation {
				return fmt.Errorf("%w: %s#%d", errFileGone, f.URI(), f.Generation)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	now := time.Now()
	for i := range t.Files {
		if h.usable(t.Files[i], t.Replay, now, wait) {
			continue
		}
		if err := r.copyFile(ctx, i, last); err != nil {
			return err
		}
	}
	return nil
}

// copyFile makes copy Copies+1 of file i of the run's task and records it on the task, fenced by
// the claim.
func (r *run) copyFile(ctx context.Context, i int, last *lastWrite) error {
	h, t := r.h, r.task
	f := t.Files[i]
	n := f.Copies + 1
	name := copyName(t, i, n)
	body, err := h.files.Objects.Open(ctx, f.Bucket, f.Object, f.Generation)
	if errors.Is(err, objects.ErrNotFound) {
		return fmt.Errorf("%w: %s#%d", errFileGone, f.URI(), f.Generation)
	}
	if err != nil {
		return err
	}
	c, err := h.files.Copier.CopyFile(ctx, name, f.MIMEType, f.Size, body)
	_ = body.Close()
	if err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.FileCopied)
	old := f.Copy
	got, ok := r.fencedWrite(ctx, "record a file copy", func(t *protocol.Task, _ time.Time) {
		if i < len(t.Files) {
			t.Files[i].Copy = &protocol.FileCopy{Name: c.Name, URI: c.URI, ExpireAt: c.ExpireAt, Replay: t.Replay}
			t.Files[i].Copies = n
		}
	})
	if !ok {
		return errLeaseLost
	}
	t.Files = got.Files
	if last != nil {
		last.set(got)
	}
	r.log.InfoContext(ctx, "file copied to the Files API", "file", f.URI(), "copy", c.Name, "expire_at", c.ExpireAt)
	crashpoint.Hit(crashpoint.FileRecorded)
	if old != nil {
		h.deleteCopy(ctx, r.log, old.Name)
	}
	return nil
}

// deleteCopies deletes the Files API copies of a task that has ended, beside what follows the
// end (its result nudge): best effort, as a copy left behind (this process died first, or the
// delete failed) expires within 48 hours.
func (h *Handler) deleteCopies(ctx context.Context, log *slog.Logger, t *protocol.Task) {
	if h.files.Copier == nil {
		return
	}
	var names []string
	for _, f := range t.Files {
		if f.Copy != nil {
			names = append(names, f.Copy.Name)
		}
	}
	if len(names) == 0 {
		return
	}
	go func() {
		for _, name := range names {
			h.deleteCopy(ctx, log, name)
		}
	}()
}

func (h *Handler) deleteCopy(ctx context.Context, log *slog.Logger, name string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := h.files.Copier.DeleteFile(ctx, name); err != nil {
		log.WarnContext(ctx, "file copy not deleted; it expires by itself", "copy", name, "error", err)
		return false
	}
	return true
}

// eraseCopies deletes the Files API copies an erased task lists (protocol.Task.FileErase) and
// takes those deleted off the list. A copy not deleted stays listed, and due: the sweeper
// nudges again, with its backoff.
func (h *Handler) eraseCopies(ctx context.Context, log *slog.Logger, id string) {
	t, err := h.store.GetTask(ctx, id)
	if err != nil {
		log.WarnContext(ctx, "erased task not read; the sweeper will nudge again", "error", err)
		return
	}
	if t.FileErase == nil || len(t.FileErase.Keys) == 0 {
		return
	}
	if h.files.Copier == nil {
		log.ErrorContext(ctx, "an erased task's file copies wait for a worker that reads files", "copies", t.FileErase.Keys)
		return
	}
	var deleted []string
	for _, name := range t.FileErase.Keys {
		if h.deleteCopy(ctx, log, name) {
			deleted = append(deleted, name)
		}
	}
	if len(deleted) == 0 {
		return
	}
	if _, err := h.store.MutateTask(context.WithoutCancel(ctx), id, func(t *protocol.Task, _ time.Time) error {
		t.CopiesErased(deleted)
		return nil
	}); err != nil {
		log.WarnContext(ctx, "erased file copies deleted but still listed; they are deleted again", "error", err)
		return
	}
	log.InfoContext(ctx, "an erased task's file copies deleted", "copies", deleted)
}
