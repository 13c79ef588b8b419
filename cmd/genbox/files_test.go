package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The README's file path in `genbox dev`: submit --attach of a PDF, an image and a recording to
// the families that read them, --wait succeeds and the webhook is delivered; the fake Gemini
// read exactly the bytes of each file, and the Files API copies are gone when the tasks end.
func TestSubmitAttach(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	env := cliEnv(s)
	dir := t.TempDir()
	for _, tc := range []struct {
		family, name string
		data         []byte
	}{
		{"extract", "invoice.pdf", []byte("%PDF-1.7\nInvoice 2026-117, total EUR 1,250.00, due 2027-01-06\n%%EOF\n")},
		{"describe", "photo.png", append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte{0x42}, 2048)...)},
		{"transcribe", "call.wav", append([]byte("RIFF\x24\x08\x00\x00WAVEfmt "), bytes.Repeat([]byte{0x01, 0x02}, 4096)...)},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, tc.data, 0o600); err != nil {
			t.Fatal(err)
		}
		r := cli(t, env, "", "submit", "--family", tc.family, "--attach", path, "--wait", "--json")
		if r.code != exitOK {
			t.Fatalf("%s: submit --attach --wait exit %d\n%s\n%s", tc.name, r.code, r.stdout, r.stderr)
		}
		var v task.View
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("%s: no task printed: %v\n%s", tc.name, err, r.stdout)
		}
		if v.State != task.StateSucceeded || v.Delivery.State != task.DeliveryDelivered || len(v.Files) != 1 || v.Files[0].Size != int64(len(tc.data)) {
			t.Fatalf("%s: task %+v, want succeeded and delivered with the file", tc.name, v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := s.Inbox.Wait(ctx, func(h doubles.Hook) bool {
			return h.Accepted() && h.ID == task.EventID(v.TaskID, task.EventSucceeded, 0)
		})
		cancel()
		if err != nil {
			t.Fatalf("%s: webhook not received: %v", tc.name, err)
		}
		sum := sha256.Sum256(tc.data)
		if !readByModel(s, hex.EncodeToString(sum[:]), v.Files[0].MIMEType) {
			t.Errorf("%s: the fake Gemini never read its %d bytes as %s", tc.name, len(tc.data), v.Files[0].MIMEType)
		}
	}
	// The copies are deleted beside the tasks' ends, not before their webhooks.
	deadline := time.Now().Add(10 * time.Second)
	for left := leftBehind(s); left != ""; left = leftBehind(s) {
		if time.Now().After(deadline) {
			t.Fatalf("Files API copy %s left behind", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leftBehind names a Files API copy not deleted, "" when none is.
func leftBehind(s *devstack.Stack) string {
	for _, f := range s.Fake.Files() {
		if !f.Deleted {
			return f.Name
		}
	}
	return ""
}

// readByModel reports whether a billed generation read a file of digest and mimeType.
func readByModel(s *devstack.Stack, digest, mimeType string) bool {
	for _, b := range s.Fake.Ledger().Bills {
		for _, f := range b.Request.Files {
			if f.SHA256 == digest && f.MIMEType == mimeType {
				return true
			}
		}
	}
	return false
}
