package geminitest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// syncBuffer is a log sink the test reads while Serve writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines() [][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n"))
}

func TestServeStandalone(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- geminitest.Serve(ctx, "127.0.0.1:0", slog.New(slog.NewJSONHandler(&logs, nil)), geminitest.WithModels(model))
	}()
	var baseURL string
	for deadline := time.Now().Add(10 * time.Second); baseURL == ""; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Serve logged no base_url: %s", logs.lines())
		}
		var rec struct {
			BaseURL string `json:"base_url"`
		}
		if err := json.Unmarshal(logs.lines()[0], &rec); err == nil {
			baseURL = rec.BaseURL
		}
	}
	client, err := genai.NewClient(ctx, &genai.ClientConfig{APIKey: "x", Backend: genai.BackendGeminiAPI, HTTPOptions: genai.HTTPOptions{BaseURL: baseURL}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := client.Models.GenerateContent(ctx, model, genai.Text("standalone"), nil); err != nil || r.Text() == "" {
		t.Fatalf("GenerateContent: %v", err)
	}
	_, err = client.Models.GenerateContent(ctx, "unknown-model", genai.Text("standalone"), nil)
	if e := apiError(t, err); e.Code != 404 || e.Status != "NOT_FOUND" {
		t.Fatalf("unknown model: %+v", e)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
	if n := len(logs.lines()); n < 2 {
		t.Errorf("Serve logged %d lines, want the address and the call", n)
	}
}
