package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// serve runs a long-running verb until the returned stop is called, and waits for re in its
// output (stdout and stderr) to learn its address.
func serve(t *testing.T, env map[string]string, re *regexp.Regexp, args ...string) (addr string, out *testenv.LogBuffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out = &testenv.LogBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), out, out)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case code := <-done:
			cancel()
			t.Fatalf("%v exited %d before serving:\n%s", args, code, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("%v never printed its address:\n%s", args, out.String())
		}
	}
	stopped := false
	code := 0
	stop = func() int {
		if !stopped {
			cancel()
			code, stopped = <-done, true
		}
		return code
	}
	t.Cleanup(func() { stop() })
	return addr, out, stop
}

// webhook listen verifies with the secret from the environment: a signed delivery is printed and
// answered 204, a forged one 401; interrupting it exits 0.
func TestWebhookListen(t *testing.T) {
	t.Parallel()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	addr, out, stop := serve(t, map[string]string{envWebhookSecret: secret}, regexp.MustCompile(`listening on (http://\S+)`),
		"webhook", "listen", "--addr", "127.0.0.1:0")
	body := []byte(`{"type":"task.succeeded","timestamp":"2026-12-02T10:00:00Z","data":{"task_id":"t1"}}`)
	post := func(secret string) int {
		s, err := webhook.NewSigner(secret)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(http.MethodPost, addr, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		s.SetHeaders(req.Header, task.EventID("t1", task.EventSucceeded, 0), time.Now(), body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(secret); code != http.StatusNoContent {
		t.Errorf("a signed delivery answered %d", code)
	}
	other, _ := webhook.NewSecret()
	if code := post(other); code != http.StatusUnauthorized {
		t.Errorf("a forged delivery answered %d", code)
	}
	if code := stop(); code != exitOK {
		t.Errorf("webhook listen exited %d", code)
	}
	if s := out.String(); !strings.Contains(s, "verified webhook-id=t1.task.succeeded.0") || !strings.Contains(s, "REJECTED") {
		t.Errorf("output:\n%s", s)
	}
	if r := cli(t, nil, "", "webhook", "listen", "--secret", "whsec_not base64!"); r.code != exitUsage || !strings.Contains(r.stderr, "whsec_") {
		t.Errorf("a malformed secret: exit %d\n%s", r.code, r.stderr)
	}
}

// fakegemini serves the Gemini REST protocol: countTokens answers with a token count.
func TestFakeGemini(t *testing.T) {
	t.Parallel()
	addr, _, stop := serve(t, nil, regexp.MustCompile(`base_url=(http://\S+)`), "fakegemini", "--addr", "127.0.0.1:0")
	req := `{"contents":[{"role":"user","parts":[{"text":"count these words please"}]}]}`
	resp, err := http.Post(addr+"/v1beta/models/gemini-2.5-flash:countTokens?key=k", "application/json", strings.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var got struct {
		TotalTokens int `json:"totalTokens"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &got) != nil || got.TotalTokens <= 0 {
		t.Errorf("countTokens answered %s: %s", resp.Status, data)
	}
	if code := stop(); code != exitOK {
		t.Errorf("fakegemini exited %d", code)
	}
}

// FuzzBuildRequest: whatever a request file holds, buildRequest returns a request or a usage
// error (never panics), and a request it accepts survives a JSON round trip unchanged.
func FuzzBuildRequest(f *testing.F) {
	f.Add([]byte(`{"family":"summarize","input":"x","labels":{"a":"b"},"config":{"temperature":0.2}}`))
	f.Add([]byte(`{"family":"classify","variant":"default","input":"y","cache":true,"max_cost_usd":0.1}`))
	f.Add([]byte(`{"run_before":"2026-12-02T10:00:00Z","input":""}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e := env{getenv: func(string) string { return "" }, stdin: bytes.NewReader(data), stdout: io.Discard, stderr: io.Discard}
		req, err := buildRequest(e, "-", "", "", "")
		if err != nil {
			if code, _ := classify(err); code != exitUsage {
				t.Fatalf("a bad request file is exit %d, want %d: %v", code, exitUsage, err)
			}
			return
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var again task.Request
		if err := json.Unmarshal(enc, &again); err != nil {
			t.Fatal(err)
		}
		enc2, _ := json.Marshal(again)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the request:\n%s\n%s", enc, enc2)
		}
	})
}
