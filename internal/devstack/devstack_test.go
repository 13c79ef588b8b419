package devstack

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// setup starts a stack of the test's own project on free ports.
func setup(t *testing.T, extra ...string) (*Stack, *testenv.LogBuffer) {
	t.Helper()
	out := &testenv.LogBuffer{}
	return StartTest(t, out, extra...), out
}

// A task submitted over REST with the dev tenant's key succeeds and its webhook reaches the
// listener, signed with the dev tenant's secret and verified there.
func TestSubmitEndsInVerifiedWebhook(t *testing.T) {
	t.Parallel()
	s, out := setup(t)
	if s.Info.EmulatorsStarted {
		t.Error("the stack started emulators although the environment names running ones")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	marker := "report-" + s.Info.Project // the fake's ledger finds the task's bills by its prompt
	v := s.SubmitWait(t, ctx, task.Request{Family: "summarize", Input: "The " + marker + " says the fox jumped."})
	if v.State != task.StateSucceeded || v.Output == nil {
		t.Fatalf("task ended %s (output %v)", v.State, v.Output)
	}
	d, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.Event().Data.TaskID == v.TaskID })
	if err != nil {
		t.Fatal(err)
	}
	if want := task.EventID(v.TaskID, task.EventSucceeded, 0); d.ID != want {
		t.Errorf("webhook-id %q, want %q", d.ID, want)
	}
	if d.Event().Type != task.EventSucceeded || d.Event().Data.Output == nil || *d.Event().Data.Output != *v.Output {
		t.Errorf("webhook event %+v does not carry the task's output", d.Event())
	}
	if !strings.Contains(out.String(), "verified webhook-id="+d.ID) {
		t.Errorf("the listener did not print the verified delivery:\n%s", out.String())
	}
	if n := len(s.Fake.Ledger().BillsFor(marker)); n != 1 {
		t.Errorf("task billed %d times, want 1", n)
	}
}

// A generation that exhausts its attempts dies: the task.dead webhook reaches the listener, the
// dlqnotifier posts the dead letter to the Slack double, and the console lists it with the
// message's buttons. A non-approver's click is refused and changes nothing; the approver's click
// on Regenerate, signed as Slack signs, runs the task again: it succeeds with a new webhook-id,
// the Slack message is updated with who decided, and a second click answers who already did.
func TestDeadLetterRegeneratedThroughSlack(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, "GENBOX_TASK_ATTEMPTS", "1", "GENBOX_MAX_ATTEMPTS", "1", "GENBOX_MODEL_CHAIN", "m-dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s.Fake.FailNext("m-dlq", 503)
	v := s.SubmitWait(t, ctx, task.Request{Family: "summarize", Input: "A report that dies once."})
	if v.State != task.StateDead {
		t.Fatalf("task ended %s, want dead", v.State)
	}
	deadID := task.EventID(v.TaskID, task.EventDead, 0)
	if _, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.ID == deadID }); err != nil {
		t.Fatalf("no %s webhook: %v", deadID, err)
	}
	dlID := protocol.DeadLetterID(v.TaskID, task.StageGeneration, 0, 0)
	post := s.WaitDeadLetterPosted(t, ctx, dlID)
	consoleURL := s.Info.SlackConsole
	page := httpGet(t, ctx, consoleURL)
	if !strings.Contains(page, dlID) || !strings.Contains(page, "Regenerate") || !strings.Contains(page, "Discard") {
		t.Fatalf("the console does not list %s with its buttons:\n%s", dlID, page)
	}

	answer, err := s.Slack.ClickAs(ctx, "UNOTANAPPROVER", post, "regenerate", "dlq:"+dlID, dlID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(answer, "approver") {
		t.Errorf("a non-approver was answered %q", answer)
	}
	if dl, err := s.Store.GetDeadLetter(ctx, dlID); err != nil || dl.State != store.DeadLetterOpen {
		t.Fatalf("after a non-approver's click the dead letter is %+v (%v), want open", dl, err)
	}

	// The approver clicks Regenerate on the console page.
	resp, err := http.PostForm(consoleURL+"console/click", url.Values{"dl": {dlID}, "action_id": {"regenerate"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("console click answered %s", resp.Status)
	}
	againID := task.EventID(v.TaskID, task.EventSucceeded, 1)
	got, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.ID == againID })
	if err != nil {
		t.Fatalf("no %s webhook after Regenerate: %v", againID, err)
	}
	if got.Event().Data.State != task.StateSucceeded || got.Event().Data.Replay != 1 {
		t.Errorf("webhook after Regenerate carries %+v", got.Event().Data)
	}
	if _, err := s.Slack.WaitCall(ctx, func(c doubles.SlackCall) bool {
		return c.Method == "chat.update" && c.TS == post.TS && strings.Contains(c.Form.Get("blocks"), s.Slack.Approver)
	}); err != nil {
		t.Errorf("the Slack message was not updated with who decided: %v", err)
	}
	// A second click from a client still showing the original message (or a second approver).
	answer, err = s.Slack.ClickAs(ctx, s.Slack.Approver, post, "regenerate", "dlq:"+dlID, dlID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(answer, "already decided by") {
		t.Errorf("a second click was answered %q", answer)
	}
	if after, err := client.New(s.Info.Publisher, s.Info.APIKey).Get(ctx, v.TaskID); err != nil || after.Replay != 1 || after.State != task.StateSucceeded {
		t.Errorf("after a second click the task is %+v (%v): nothing may repeat", after, err)
	}
}

// A forged click — signed with another secret — is refused with 401 and changes nothing.
func TestForgedClickRefused(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	forger := *s.Slack
	forger.Sign = func(ts time.Time, body []byte) http.Header {
		return dlqnotifier.SignSlackRequest("not-the-signing-secret", ts, body)
	}
	_, err := forger.ClickAs(ctx, s.Slack.Approver, doubles.SlackCall{Channel: "C1", TS: "1.000001"}, "discard", "dlq:x", "t1:generation:0:0")
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a forged click: %v, want a 401 refusal", err)
	}
}

func httpGet(t *testing.T, ctx context.Context, u string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The configuration names the variable of every bad value, and the services' environment keeps
// what the dev stack decides whatever the user's environment says.
func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, key, value, want string
	}{
		{"bad webhook secret", EnvWebhookSecret, "whsec_!!", EnvWebhookSecret},
		{"short admin key", EnvAdminKey, "short", EnvAdminKey},
		{"short api key", EnvAPIKey, "short", EnvAPIKey},
	} {
		_, err := FromEnv(ShortEnv(tc.key, tc.value))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	cfg, err := FromEnv(ShortEnv("GENBOX_CONSUMER", "push", "GENBOX_ALLOW_INSECURE_CALLBACKS", "false",
		"GOOGLE_GEMINI_BASE_URL", "https://elsewhere", EnvApprovers, " U1, U2 ,", "GENBOX_RETRY_BASE", "7s"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Approvers) != 2 || cfg.Approvers[0] != "U1" || cfg.Approvers[1] != "U2" {
		t.Errorf("approvers %q", cfg.Approvers)
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	env := cfg.ServiceEnv("http://127.0.0.1:9", "http://127.0.0.1:10")
	for name, want := range map[string]string{
		"GENBOX_CONSUMER": "pull", "GENBOX_ALLOW_INSECURE_CALLBACKS": "true", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9",
		"GENBOX_SLACK_API_URL": "http://127.0.0.1:10", EnvProject: DefaultProject, EnvApprovers: "U1,U2",
		EnvSlackChannel: DefaultChannel, "GENBOX_RETRY_BASE": "7s", EnvAdminKey: cfg.AdminKey,
		"GENBOX_WEBHOOK_SECRETS_KEY": cfg.SecretsKey,
	} {
		if got := env(name); got != want {
			t.Errorf("service env %s = %q, want %q", name, got, want)
		}
	}
	if len(cfg.generated) != 5 {
		t.Errorf("generated %q, want the five secrets", cfg.generated)
	}
}

// `genbox dev` restarted on emulators that kept the dev tenant: the new webhook secret signs and
// the same API key still authenticates.
func TestRestartOnReusedEmulators(t *testing.T) {
	t.Parallel()
	project := emulator.ProjectID(t)
	start := func(apiKey string) (*Stack, func()) {
		cfg, err := FromEnv(ShortEnv(EnvAPIKey, apiKey))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Project = project
		cfg.PublisherAddr, cfg.DLQAddr, cfg.SlackAddr, cfg.WebhookAddr, cfg.GeminiAddr =
			"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s, func() {
			if err := s.Close(context.Background()); err != nil {
				t.Error(err)
			}
		}
	}
	const key = "gbx_dev_restart_0123456789abcdef"
	first, stop := start(key)
	firstSecret := first.cfg.WebhookSecret
	stop()
	s, stop := start(key)
	defer stop()
	if s.cfg.WebhookSecret == firstSecret {
		t.Fatal("the second run did not generate a new webhook secret")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client.New(s.Info.Publisher, key)
	res, err := c.Submit(ctx, task.Request{Family: "summarize", Input: "After a restart.", CallbackURL: s.Info.WebhookURL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool { return d.Event().Data.TaskID == res.TaskID }); err != nil {
		t.Fatalf("no verified webhook after a restart: %v", err)
	}
}
