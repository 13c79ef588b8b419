package publisher

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/fscount"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// instance starts another publisher instance on e's Firestore project, with its own key cache;
// listening says whether it runs the revocation listener.
func (e *env) instance(listening bool) (*Server, *client.Client) {
	e.t.Helper()
	srv, err := New(e.cfg, Deps{Store: e.st, Publisher: e.pub, Families: testFamilies})
	if err != nil {
		e.t.Fatal(err)
	}
	if listening {
		watch(e.t, srv)
	}
	hs := httptest.NewServer(srv)
	e.t.Cleanup(hs.Close)
	return srv, client.New(hs.URL, e.key, client.WithRetries(0))
}

// waitCurrent waits until srv's revocation listener has delivered every revoked key.
func waitCurrent(t testing.TB, srv *Server) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		srv.keys.mu.Lock()
		current := srv.keys.current
		srv.keys.mu.Unlock()
		if current {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the revocation listener never became current")
		}
	}
}

// A key revoked through one instance is refused by that instance on the next request, by an
// instance without a listener on the next request (it reads the key), and by a listening
// instance that had the key in memory as soon as Firestore's listener delivers the revocation.
func TestRevocationReachesEveryInstance(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	other, listening := e.instance(true)
	_, reading := e.instance(false)
	r := e.submit(validRequest())
	for _, c := range []*client.Client{e.api, listening, reading} {
		if _, err := c.Get(ctx, r.TaskID); err != nil {
			t.Fatal(err)
		}
	}
	waitCurrent(t, e.srv)
	waitCurrent(t, other)
	if _, err := e.admin.RevokeAPIKey(ctx, store.APIKeyID(e.key)); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	var p *task.Problem
	for name, c := range map[string]*client.Client{"revoking instance": e.api, "instance without a listener": reading} {
		if _, err := c.Get(ctx, r.TaskID); !errors.As(err, &p) || p.Status != 401 {
			t.Fatalf("%s, next request after the revocation: %v", name, err)
		}
	}
	for deadline := revoked.Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err := listening.Get(ctx, r.TaskID)
		if errors.As(err, &p) && p.Status == 401 {
			break
		}
		if err != nil {
			t.Fatalf("listening instance: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the listening instance still accepts the revoked key after 30 s")
		}
	}
	t.Logf("the listening instance refused the revoked key %s after the revocation", time.Since(revoked).Round(time.Millisecond))
}

// An instance whose listener has stalled (current, yet delivering nothing) still refuses a
// revoked key once keysMaxAge has passed since it last read the key.
func TestStalledListenerTrustsAKeyForMaxAge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	st := *e.st
	clock := testenv.NewClock(time.Now())
	st.Now = clock.Now
	srv, err := New(e.cfg, Deps{Store: &st, Publisher: e.pub, Families: testFamilies})
	if err != nil {
		t.Fatal(err)
	}
	srv.keys.current = true // a listener that says it is current and never delivers
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	stalled := client.New(hs.URL, e.key, client.WithRetries(0))
	r := e.submit(validRequest())
	if _, err := stalled.Get(ctx, r.TaskID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RevokeAPIKey(ctx, store.APIKeyID(e.key)); err != nil {
		t.Fatal(err)
	}
	clock.Add(keysMaxAge)
	var p *task.Problem
	if _, err := stalled.Get(ctx, r.TaskID); !errors.As(err, &p) || p.Status != 401 {
		t.Fatalf("a key revoked under a stalled listener, %s after it was read: %v, want 401", keysMaxAge, err)
	}
}

// counted makes the server's store count its Firestore operations in counter.
func counted(t testing.TB, counter *fscount.Counter) option {
	t.Helper()
	return func(cfg *Config, d *Deps) {
		fs, err := counter.EmulatorClient(context.Background(), os.Getenv(emulator.FirestoreHostEnv), cfg.ProjectID)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fs.Close() })
		d.Store = store.New(fs)
		d.Store.Secrets = testenv.Secrets()
	}
}

// With the listener current, a submission with a key already seen costs one Firestore write and
// no read: the bare create the handler must do. (The tenant's slot count is read with its first
// submission, then in the background at most once a second: the store's clock is stopped here.)
func TestWarmSubmitCostsOneWrite(t *testing.T) {
	t.Parallel()
	counter := &fscount.Counter{}
	at := time.Now()
	e := setup(t, counted(t, counter), func(_ *Config, d *Deps) { d.Store.Now = func() time.Time { return at } })
	e.submit(validRequest())
	waitCurrent(t, e.srv)
	before := counter.Counts()
	const n = 5
	for range n {
		e.submit(validRequest())
	}
	if got, want := counter.Counts().Sub(before), (fscount.Counts{Writes: n, Commits: n}); got != want {
		t.Fatalf("%d warm submissions cost %+v, want %+v", n, got, want)
	}
}

// A client sending unknown API keys is answered 429 once its burst of failures is spent; a valid
// key keeps working from the same address, and another client is not held back. Wrong admin
// keys are throttled alike.
func TestFailedAuthThrottled(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	e := setup(t, func(_ *Config, d *Deps) { d.Store.Now = func() time.Time { return at } })
	waitCurrent(t, e.srv)
	if code, _, body := e.do("GET", "/v1/tasks", e.key, nil, nil); code != 200 {
		t.Fatalf("a valid key: %d %s", code, body)
	}
	burst := authlimit.DefaultConfig().ClientBurst
	const extra = 30
	codes := map[int]int{}
	for i := range burst + extra {
		code, h, body := e.do("GET", "/v1/tasks", fmt.Sprintf("gbx_unknown_%d", i), nil, nil)
		codes[code]++
		if code == 429 {
			if p := problemOf(t, h, body); p.Type != httpapi.ProblemBase+httpapi.TypeRateLimited || h.Get("Retry-After") == "" {
				t.Fatalf("throttled answer %d %v %s", code, h, body)
			}
		}
	}
	if diff := cmp.Diff(map[int]int{401: burst, 429: extra}, codes); diff != "" {
		t.Errorf("statuses of %d unknown keys (-want +got):\n%s", burst+extra, diff)
	}
	if code, _, body := e.do("GET", "/v1/tasks", e.key, nil, nil); code != 200 {
		t.Errorf("a valid key from the throttled client: %d %s, want 200", code, body)
	}
	if code, _, body := e.do("GET", "/v1/tasks", "gbx_unknown_x", nil, map[string]string{"X-Forwarded-For": "203.0.113.9"}); code != 401 {
		t.Errorf("another client: %d %s, want 401", code, body)
	}
	admin := map[int]int{}
	for range burst + extra {
		code, _, _ := e.do("GET", "/admin/v1/tenants/"+e.tenant, "wrong-admin-key-0123456789", nil, map[string]string{"X-Forwarded-For": "203.0.113.10"})
		admin[code]++
	}
	if diff := cmp.Diff(map[int]int{403: burst, 429: extra}, admin); diff != "" {
		t.Errorf("statuses of %d wrong admin keys (-want +got):\n%s", burst+extra, diff)
	}
}

// Failures from many addresses — each /64 of one /56 of IPv6, 256 clients — spend every
// client's budget of failures together: a failing key is then answered 429 from any address,
// but no valid credential is refused for it: neither an API key this instance has never read
// nor the admin key.
func TestOthersFailuresRefuseNoValidCredential(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	e := setup(t, func(_ *Config, d *Deps) { d.Store.Now = func() time.Time { return at } })
	waitCurrent(t, e.srv)
	_, fresh := e.newTenant("globex", nil) // never presented yet: this instance must read it
	for i := range 256 {
		from := fmt.Sprintf("2001:db8:0:ff%02x::1", i)
		e.do("GET", "/v1/tasks", fmt.Sprintf("gbx_guess_%d", i), nil, map[string]string{"X-Forwarded-For": from})
	}
	const outsider = "198.51.100.77"
	if code, _, body := e.do("GET", "/v1/tasks", "gbx_guess_x", nil, map[string]string{"X-Forwarded-For": outsider}); code != 429 {
		t.Errorf("a failing key once every client's failures are spent: %d %s, want 429", code, body)
	}
	if code, _, body := e.do("GET", "/v1/tasks", fresh, nil, map[string]string{"X-Forwarded-For": outsider}); code != 200 {
		t.Errorf("a valid API key never read before: %d %s, want 200", code, body)
	}
	if code, _, body := e.do("GET", "/v1/tasks", e.key, nil, map[string]string{"X-Forwarded-For": "2001:db8:0:ff00::2"}); code != 200 {
		t.Errorf("a valid API key from a failing address: %d %s, want 200", code, body)
	}
	if code, _, body := e.do("GET", "/admin/v1/tenants/"+e.tenant, testAdminKey, nil, map[string]string{"X-Forwarded-For": outsider}); code != 200 {
		t.Errorf("the admin key: %d %s, want 200", code, body)
	}
}
