package doubles_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

func newSecret(t *testing.T) string {
	t.Helper()
	s, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// post sends body to url as webhook id, signed with secret, and returns the status.
func post(t *testing.T, url, secret, id, body string) (int, error) {
	t.Helper()
	signer, err := webhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	signer.SetHeaders(req.Header, id, time.Now(), []byte(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// A Receiver records what genbox's signer signs for its secret as verified, a forged signature
// as not, answers its schedule, and refuses connections between Stop and Start.
func TestReceiver(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	r := doubles.NewReceiver(t, secret)
	r.Schedule = func(n int) int { return []int{http.StatusNoContent, http.StatusGone}[n-1] }
	if code, err := post(t, r.URL(), secret, "msg_1", `{"n":1}`); err != nil || code != http.StatusNoContent {
		t.Fatalf("first post: %d %v", code, err)
	}
	if code, err := post(t, r.URL(), newSecret(t), "msg_2", `{"n":1}`); err != nil || code != http.StatusGone {
		t.Fatalf("second post: %d %v", code, err)
	}
	hooks := r.Hooks()
	if len(hooks) != 2 || hooks[0].ID != "msg_1" || hooks[0].VerifyErr != nil || hooks[0].Body != `{"n":1}` ||
		hooks[1].VerifyErr == nil || hooks[1].Status != http.StatusGone {
		t.Fatalf("hooks %+v", hooks)
	}
	addr := r.Addr()
	r.Stop()
	if _, err := post(t, r.URL(), secret, "msg_3", `{}`); err == nil {
		t.Fatal("a stopped receiver answered")
	}
	r.Schedule = nil
	r.Start(t, addr)
	if code, err := post(t, r.URL(), secret, "msg_4", `{}`); err != nil || code != http.StatusNoContent {
		t.Fatalf("after Start again on %s: %d %v", addr, code, err)
	}
}

// Without a schedule a Receiver answers 204 to what verifies and 401 to what does not, and
// tallies, per webhook-id, what it accepted.
func TestReceiverTally(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	r := doubles.NewReceiver(t, secret)
	delivered := r.Delivered("a")
	select {
	case <-delivered:
		t.Fatal("delivered before any request")
	default:
	}
	for _, p := range []struct {
		secret, id string
		want       int
	}{{secret, "a", 204}, {secret, "a", 204}, {secret, "b", 204}, {newSecret(t), "c", 401}} {
		if code, err := post(t, r.URL(), p.secret, p.id, `{}`); err != nil || code != p.want {
			t.Fatalf("post %s: %d %v, want %d", p.id, code, err, p.want)
		}
	}
	<-delivered
	distinct, dups, unverified := r.Tally()
	if diff := cmp.Diff([3]int{2, 1, 1}, [3]int{distinct, dups, unverified}); diff != "" {
		t.Errorf("tally (distinct, duplicates, unverified) (-want +got):\n%s", diff)
	}
	if n := len(r.Deliveries("a")); n != 2 {
		t.Errorf("%d deliveries of a, want 2", n)
	}
	if n := len(r.Deliveries("c")); n != 0 {
		t.Errorf("%d deliveries of c (unverified), want 0", n)
	}
}

// With Respond set, its answer is what the sender gets and what is recorded; Answered runs
// once the answer has been sent.
func TestReceiverRespond(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r := doubles.New(secret)
	r.Respond = webhook.Receiver(v, &out)
	answered := make(chan doubles.Hook, 1)
	r.Answered = func(h doubles.Hook) { answered <- h }
	r.Start(t, "127.0.0.1:0")
	if code, err := post(t, r.URL(), secret, "msg_1", `{"type":"task.succeeded"}`); err != nil || code != http.StatusNoContent {
		t.Fatalf("post: %d %v", code, err)
	}
	if h := <-answered; h.ID != "msg_1" || h.Status != http.StatusNoContent || h.Event().Type != "task.succeeded" {
		t.Errorf("answered %+v (event %+v)", h, h.Event())
	}
	if !strings.Contains(out.String(), "verified webhook-id=msg_1 type=task.succeeded") {
		t.Errorf("printed %q", out.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.Wait(ctx, func(h doubles.Hook) bool { return h.ID == "msg_1" }); err != nil {
		t.Fatal(err)
	}
}
