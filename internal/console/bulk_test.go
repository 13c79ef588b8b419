package console_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/store"
)

var (
	bulkID      = regexp.MustCompile(`name="id" value="([^"]+)"`)
	bulkResults = regexp.MustCompile(`(?s)<ul id="results"[^>]*>(.*?)</ul>`)
	bulkResult  = regexp.MustCompile(`<li>([^<]+)</li>`)
)

// A bulk decision over a filtered view shows its count before it runs, decides every dead
// letter of the view once, through the same decision code as one button, by the session's
// operator; submitting the same form again repeats nothing.
func TestBulkDecisionDecidesEachOnce(t *testing.T) {
	t.Parallel()
	s := devstack.StartTest(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n = 3
	var (
		mu  sync.Mutex
		dls []string
		wg  sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			_, dl := deadDelivery(t, ctx, s)
			mu.Lock()
			dls = append(dls, dl)
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	c := browser(t)
	csrf := login(t, c, s.Info.Console)

	if code, body := get(t, c, s.Info.DLQ+"/console/bulk?action=redeliver&tenant=someone-else"); code != 200 || bulkID.MatchString(body) {
		t.Errorf("a filter that matches nothing: %d, with ids to decide:\n%s", code, body)
	}
	code, body := get(t, c, s.Info.DLQ+"/console/bulk?action=redeliver&stage=delivery&tenant="+devstack.DevTenant)
	if code != 200 {
		t.Fatalf("bulk preview: %d\n%s", code, body)
	}
	var shown []string
	for _, m := range bulkID.FindAllStringSubmatch(body, -1) {
		shown = append(shown, m[1])
	}
	slices.Sort(shown)
	slices.Sort(dls)
	if !slices.Equal(shown, dls) {
		t.Fatalf("the preview lists %v, want the %d dead letters %v", shown, n, dls)
	}
	if !strings.Contains(body, "<strong>redeliver</strong> 3 dead letters") {
		t.Errorf("the preview does not state its count:\n%s", body)
	}

	form := url.Values{"csrf": {csrf}, "action": {"redeliver"}, "id": shown}
	if code, _ := post(t, c, s.Info.DLQ+"/console/bulk", url.Values{"action": {"redeliver"}, "id": shown}); code != 403 {
		t.Errorf("a bulk decision without the CSRF token: %d, want 403", code)
	}
	for round, want := range []string{"redeliver recorded", "nothing was repeated"} {
		results := bulkPost(t, c, s.Info.DLQ+"/console/bulk", form)
		if len(results) != n {
			t.Fatalf("submission %d: %d results %v, want one per dead letter", round, len(results), results)
		}
		for _, r := range results {
			if !strings.Contains(r, want) {
				t.Errorf("submission %d: %q, want it to say %q", round, r, want)
			}
		}
	}
	for _, id := range dls {
		d, err := s.Store.GetDeadLetter(ctx, id)
		if err != nil || d.State != store.DeadLetterRedelivered || d.DecidedBy != devDecider(s) {
			t.Errorf("dead letter %s after the bulk decision: %+v %v, want redelivered by %s", id, d, err, devDecider(s))
		}
	}
}

// bulkPost submits the bulk form and returns the results the page lists.
func bulkPost(t *testing.T, c *http.Client, u string, form url.Values) []string {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("bulk decision: %d\n%s", resp.StatusCode, b)
	}
	list := bulkResults.FindSubmatch(b)
	if list == nil {
		t.Fatalf("bulk decision: no results listed\n%s", b)
	}
	var out []string
	for _, m := range bulkResult.FindAllStringSubmatch(string(list[1]), -1) {
		out = append(out, html.UnescapeString(m[1]))
	}
	return out
}
