package publisher

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// answerDeadline is how long a test waits for any answer while the store stalls: far above the
// store's bound, far below the server's WriteTimeout (a minute), past which a hung request is cut
// without an answer.
const answerDeadline = 30 * time.Second

// stalled is a publisher served as its process serves it (probes included), on a Firestore held
// by a Stall.
type stalled struct {
	stall *testenv.Stall
	base  string
	key   string
	st    *store.Store
}

func setupStalled(t *testing.T) *stalled {
	t.Helper()
	project := emulator.ProjectID(t)
	stall := testenv.NewStall(t, os.Getenv(emulator.FirestoreHostEnv))
	st := store.New(testenv.FirestoreAt(t, project, stall.Addr()))
	st.Secrets = testenv.Secrets()
	cfg := DefaultConfig()
	cfg.ProjectID, cfg.AdminKey, cfg.SecretsKey = project, testAdminKey, testenv.SecretsKey
	cfg.StoreTimeout = time.Second
	log := slog.New(slog.DiscardHandler)
	a, err := Assemble(Settings{Config: cfg, families: testFamilies}, Infra{Store: st, Publisher: &testenv.Publisher{}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, ln, "publisher", log, a.Lifecycle(), nil) }()
	t.Cleanup(func() {
		stall.Release()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	base := "http://" + ln.Addr().String()
	testenv.Ready(t, base, 30*time.Second)
	admin := client.New(base, testAdminKey, client.WithRetries(0))
	if _, err := admin.CreateTenant(ctx, "acme", &task.Limits{SubmitRate: 1000, SubmitBurst: 1000}); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateAPIKey(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return &stalled{stall: stall, base: base, key: k.Key, st: st}
}

// send sends a request and returns its answer, or fails t when none comes within answerDeadline.
func (s *stalled) send(t *testing.T, method, path string, body []byte, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: answerDeadline}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: no answer: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// While Firestore stalls (every byte held, the connection open), a submission answers 503 with
// Retry-After as problem+json instead of hanging until the server cuts it, and the instance is
// unready; once the store is back, a retry under the same Idempotency-Key gets the one task.
func TestSubmitWhileTheStoreStalls(t *testing.T) {
	t.Parallel()
	s := setupStalled(t)
	// A warm instance: the key and the tenant's limits are known, only the write is left.
	if code, _, body := s.send(t, "POST", "/v1/tasks", mustJSON(t, validRequest()), nil); code != http.StatusAccepted {
		t.Fatalf("submit before the stall: %d %s", code, body)
	}

	s.stall.Hold()
	req := mustJSON(t, task.Request{Family: "summarize", Input: "submitted while the store stalls"})
	idem := map[string]string{task.HeaderIdempotencyKey: "stalled-1"}
	code, h, body := s.send(t, "POST", "/v1/tasks", req, idem)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("submit while the store stalls: %d %s, want 503", code, body)
	}
	if p := problemOf(t, h, body); p.Status != http.StatusServiceUnavailable {
		t.Errorf("problem status %d, want 503", p.Status)
	}
	if h.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	resp, err := (&http.Client{Timeout: answerDeadline}).Get(s.base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz while the store stalls: %d, want 503", resp.StatusCode)
	}

	s.stall.Release()
	code, _, body = s.send(t, "POST", "/v1/tasks", req, idem)
	if code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("retry after the stall: %d %s, want 202 (or 200 if the stalled write landed)", code, body)
	}
	again, _, body := s.send(t, "POST", "/v1/tasks", req, idem)
	if again != http.StatusOK {
		t.Fatalf("second retry: %d %s, want 200 (replayed)", again, body)
	}
	tasks, _, err := s.st.ListTasks(context.Background(), "acme", "", 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 {
		t.Errorf("%d tasks, want 2 (one before the stall, one for the key)", len(tasks))
	}
}

// Every route a tenant reads through answers while the store stalls: a 503 the client retries,
// never a hang.
func TestReadsWhileTheStoreStalls(t *testing.T) {
	t.Parallel()
	s := setupStalled(t)
	code, _, body := s.send(t, "POST", "/v1/tasks", mustJSON(t, validRequest()), nil)
	if code != http.StatusAccepted {
		t.Fatalf("submit before the stall: %d %s", code, body)
	}
	id := derivedID("acme", "none") // a well-formed id: the store is asked for it
	s.stall.Hold()
	for _, rt := range []struct{ method, path string }{
		{"GET", "/v1/tasks"},
		{"GET", "/v1/tasks/" + id},
		{"GET", "/v1/tasks/" + id + "/events"},
		{"POST", "/v1/tasks/" + id + ":cancel"},
		{"DELETE", "/v1/tasks/" + id},
	} {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			t.Parallel()
			code, h, body := s.send(t, rt.method, rt.path, nil, nil)
			if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
				t.Errorf("%d (Retry-After %q) %s, want 503 with Retry-After", code, h.Get("Retry-After"), body)
			}
		})
	}
}
