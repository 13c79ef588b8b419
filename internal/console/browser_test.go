package console_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// chromium finds the Debian chromium package's browser, or skips the test saying how to get it.
func chromium(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("browser tests do not run under -short")
	}
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Skip("no chromium: the browser tests need Debian's chromium package (apt-get install -y chromium; .ci/run installs it)")
	return ""
}

// headless starts a headless Chromium with a fresh profile and none of its own network
// traffic (this machine has no network beyond loopback), closed when t ends.
func headless(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first action starts the browser, on a context without a timeout (a timeout there
	// would stop the browser), so its start is bounded by stopping the browser instead; the
	// test's actions are bounded after it.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx, chromedp.Navigate("about:blank")) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("start chromium: %v", err)
		}
	case <-time.After(2 * time.Minute):
		cancel()
		cancelAlloc()
		t.Fatalf("chromium did not start within 2 minutes")
	}
	tctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(cancelT)
	return tctx
}

// shots saves screenshots into the test's artifact directory.
type shots struct {
	t   *testing.T
	dir string
	n   int
}

func newShots(t *testing.T) *shots {
	t.Helper()
	dir := t.ArtifactDir()
	t.Logf("screenshots: %s", dir)
	return &shots{t: t, dir: dir}
}

func (s *shots) take(ctx context.Context, name string) {
	s.t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100) /* 100: PNG */)
	if err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	s.n++
	path := filepath.Join(s.dir, strings.ReplaceAll(time.Now().Format("150405")+"-"+name, " ", "-")+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// An operator logs in through the dev URL, sees a task submitted meanwhile appear on the Tasks
// page and reach succeeded without reloading, opens it, and discards its dead webhook delivery
// with a double click: the decision is recorded once, by the session's operator.
func TestBrowserFollowsATaskAndDecidesItsDeadLetter(t *testing.T) {
	t.Parallel()
	// Generations take 3 s, so the live page shows the task before it succeeds. The stack starts
	// first: the browser's time budget is its own.
	s := devstack.StartTestWith(t, func(c *devstack.Config) {
		c.Fake = []geminitest.Option{geminitest.WithLatency("", geminitest.Fixed(3*time.Second))}
	})
	ctx := headless(t)
	shot := newShots(t)

	if err := chromedp.Do(ctx, chromedp.Navigate(s.Info.Console), chromedp.WaitVisible(`h1`)); err != nil {
		t.Fatal(err)
	}
	if title, err := chromedp.Run(ctx, chromedp.Text(`h1`)); err != nil || title != "Overview" {
		t.Fatalf("after the login link: %q (%v), want the Overview", title, err)
	}
	shot.take(ctx, "overview")

	if err := chromedp.Do(ctx, chromedp.Click(`nav a[href="/console/tasks"]`), chromedp.WaitVisible(`#tasks`)); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := client.New(s.Info.Publisher, s.Info.APIKey).Submit(sctx, task.Request{Family: "summarize",
		Input: "seen live in the console", CallbackURL: s.Info.DLQ + "/no-such-receiver"})
	if err != nil {
		t.Fatal(err)
	}
	row := `tr[data-task="` + res.TaskID + `"]`
	if err := chromedp.Do(ctx, chromedp.WaitVisible(row)); err != nil {
		t.Fatalf("the submitted task never appeared on the live Tasks page: %v", err)
	}
	shot.take(ctx, "task appeared")
	if err := chromedp.Do(ctx, chromedp.WaitVisible(row+` td.state[data-state="succeeded"]`)); err != nil {
		t.Fatalf("the task never showed succeeded: %v", err)
	}
	shot.take(ctx, "task succeeded")

	if err := chromedp.Do(ctx, chromedp.Click(row+` a`), chromedp.WaitVisible(`#state`)); err != nil {
		t.Fatal(err)
	}
	if state, err := chromedp.Run(ctx, chromedp.Text(`#state`)); err != nil || state != "succeeded" {
		t.Fatalf("task page: state %q (%v)", state, err)
	}
	shot.take(ctx, "task page")

	dl := res.TaskID + ":delivery:0:0:" + task.EventID(res.TaskID, task.EventSucceeded, 0)[len(res.TaskID)+1:]
	s.WaitDeadLetterPosted(t, sctx, dl)
	form := `tr[data-dead-letter="` + dl + `"] form.decide`
	if err := chromedp.Do(ctx, chromedp.Navigate(s.Info.DLQ+"/console/dead-letters"), chromedp.WaitVisible(form)); err != nil {
		t.Fatalf("the dead letter is not on the Dead letters page: %v", err)
	}
	shot.take(ctx, "dead letters")
	if err := chromedp.Do(ctx, chromedp.DoubleClick(form+` button[value="discard"]`), chromedp.WaitVisible(`#flash`)); err != nil {
		t.Fatalf("decide: %v", err)
	}
	flash, err := chromedp.Run(ctx, chromedp.Text(`#flash`))
	if err != nil {
		t.Fatal(err)
	}
	shot.take(ctx, "decided")
	if !strings.Contains(flash, "discard recorded") {
		t.Errorf("after the double click the page says %q, want the decision recorded", flash)
	}
	d, err := s.Store.GetDeadLetter(sctx, dl)
	if err != nil || d.State != store.DeadLetterDiscarded || d.DecidedBy != devDecider(s) {
		t.Fatalf("dead letter %+v %v, want discarded by %s", d, err, devDecider(s))
	}
	// The task page shows the one decision, and no button is left.
	if err := chromedp.Do(ctx, chromedp.Navigate(s.Info.DLQ+"/console/tasks/"+res.TaskID), chromedp.WaitVisible(`#dead-letters`)); err != nil {
		t.Fatal(err)
	}
	decision, err := chromedp.Run(ctx, chromedp.Text(`tr[data-dead-letter="`+dl+`"] td.decision`))
	if err != nil {
		t.Fatal(err)
	}
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#dead-letters button').length`))
	if err != nil {
		t.Fatal(err)
	}
	shot.take(ctx, "task decided")
	if strings.Count(decision, "discarded by "+devDecider(s)) != 1 || buttons != 0 {
		t.Errorf("task page: decision %q with %d buttons, want one discard by %s and none", decision, buttons, devDecider(s))
	}
	if v, err := client.New(s.Info.Publisher, s.Info.APIKey).Get(sctx, res.TaskID); err != nil || v.Delivery.State != task.DeliveryDiscarded {
		t.Errorf("task delivery %+v %v, want discarded", v, err)
	}
}
