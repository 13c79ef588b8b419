package main

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// TestRunServesAndShutsDown runs the service as Cloud Run would (PORT=0 here) against the
// emulators: admin sets up a tenant, a task is submitted and its nudge arrives, SIGTERM (ctx)
// ends run cleanly.
func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	project := emulator.ProjectID(t)
	topo := bus.DefaultTopology()
	topo.AckDeadline = 10 * time.Second
	ps := testenv.Bus(t, project, topo)
	env := map[string]string{"PORT": "0", "GOOGLE_CLOUD_PROJECT": project, "GENBOX_ADMIN_KEY": "an-admin-key-for-tests",
		"GENBOX_WEBHOOK_SECRETS_KEY": testenv.SecretsKey}
	var mu sync.Mutex
	asked := map[string]bool{}
	getenv := func(k string) string {
		mu.Lock()
		defer mu.Unlock()
		asked[k] = true
		return env[k]
	}
	ctx := context.Background()
	svc := testenv.StartWith(t, run, getenv)
	base := svc.Started(t, "publisher", 30*time.Second)
	testenv.Ready(t, base, 30*time.Second)
	admin := client.New(base, env["GENBOX_ADMIN_KEY"])
	if _, err := admin.CreateTenant(ctx, "acme", nil); err != nil {
		t.Fatal(err)
	}
	key, err := admin.CreateAPIKey(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.New(base, key.Key).Submit(ctx, task.Request{Family: "summarize", Input: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got string
	_ = bus.Pull(rctx, ps, bus.SubWorker, bus.PullSettings{NumGoroutines: 1}, bus.HandlerFunc(func(_ context.Context, m *bus.Message) bus.Result {
		if m.Attributes[task.AttrTaskID] == r.TaskID {
			got = m.Attributes[task.AttrTenant]
			cancel()
		}
		return bus.Ack
	}))
	if got != "acme" {
		t.Fatalf("nudge of %s not received (tenant %q)", r.TaskID, got)
	}
	svc.StopClean(t)
	for _, name := range []string{"PORT", "GOOGLE_CLOUD_PROJECT", "GENBOX_ADMIN_KEY", "GENBOX_MAX_BODY_BYTES",
		"GENBOX_ALLOW_INSECURE_CALLBACKS", "GENBOX_PUBLIC_URL", "GENBOX_SECRET_OVERLAP", "GENBOX_PROMPTS_DIR"} {
		if !asked[name] {
			t.Errorf("run never read %s", name)
		}
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		name string
	}{
		{map[string]string{}, "GOOGLE_CLOUD_PROJECT"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GENBOX_MAX_BODY_BYTES": "lots"}, "GENBOX_MAX_BODY_BYTES"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GENBOX_ADMIN_KEY": "short"}, "GENBOX_ADMIN_KEY"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GENBOX_SECRET_OVERLAP": "1 day"}, "GENBOX_SECRET_OVERLAP"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GENBOX_PUBLIC_URL": "example.com"}, "GENBOX_PUBLIC_URL"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GENBOX_ALLOW_INSECURE_CALLBACKS": "maybe"}, "GENBOX_ALLOW_INSECURE_CALLBACKS"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GENBOX_PROMPTS_DIR": "/nonexistent/genbox-prompts", "GENBOX_WEBHOOK_SECRETS_KEY": testenv.SecretsKey}, "GENBOX_PROMPTS_DIR"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p"}, "GENBOX_WEBHOOK_SECRETS_KEY"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GENBOX_WEBHOOK_SECRETS_KEY": "whsec_not_a_key"}, "GENBOX_WEBHOOK_SECRETS_KEY"},
	} {
		err := run(testenv.Ended(), func(k string) string { return c.env[k] }, &testenv.LogBuffer{})
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("env %v: %v, want an error naming %s", c.env, err, c.name)
		}
	}
}
