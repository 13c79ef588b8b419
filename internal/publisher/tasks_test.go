package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestSubmitWritesFirstThenNudges(t *testing.T) {
	t.Parallel()
	e := setup(t)
	before := time.Now().UTC()
	code, h, body := e.do("POST", "/v1/tasks", e.key, mustJSON(t, task.Request{Family: "summarize", Variant: "digest",
		Input: "hello", Cache: true, Config: &task.GenConfig{Temperature: new(0.3)}}), nil)
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", code, body)
	}
	var r task.SubmitResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if r.State != task.StateQueued || r.StatusURL != e.url+"/v1/tasks/"+r.TaskID || h.Get("Location") != r.StatusURL {
		t.Fatalf("answer %+v, Location %q", r, h.Get("Location"))
	}
	doc, err := e.st.GetTask(context.Background(), r.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Tenant != e.tenant || doc.Family != "summarize" || doc.Variant != "digest" || doc.Input != "hello" || !doc.Cache ||
		doc.RequestHash == "" || doc.Delivery.State != task.DeliveryNone || *doc.GenConfig.Temperature != 0.3 {
		t.Fatalf("document %+v", doc)
	}
	fam, _ := testFamilies.Variant("summarize", "digest")
	if doc.PromptVersion == "" || doc.PromptVersion != fam.Version || !slices.Equal(doc.ModelChain, fam.Models) {
		t.Fatalf("prompt version %q and model chain %v, want the family's %q %v", doc.PromptVersion, doc.ModelChain, fam.Version, fam.Models)
	}
	// Due at now + grace: the sweeper nudges it if the publish below was lost.
	if doc.DueAt == nil || doc.DueAt.Before(before.Add(e.cfg.NudgeGrace)) || doc.DueAt.After(time.Now().Add(e.cfg.NudgeGrace)) {
		t.Fatalf("due_at %v, want now+%s", doc.DueAt, e.cfg.NudgeGrace)
	}
	msgs := e.pub.On(bus.TopicTasks)
	want := map[string]string{task.AttrTaskID: r.TaskID, task.AttrTenant: e.tenant, task.AttrFamily: "summarize", task.AttrVariant: "digest"}
	if len(msgs) != 1 || !equalMaps(msgs[0].Attrs, want) {
		t.Fatalf("nudges %+v, want one with %v", msgs, want)
	}
	v, err := e.api.Get(context.Background(), r.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if v.TaskID != r.TaskID || v.State != task.StateQueued || v.Variant != "digest" || v.Delivery.State != task.DeliveryNone {
		t.Fatalf("view %+v", v)
	}
	// Without an Idempotency-Key every request is a new task with a random id.
	r2 := e.submit(task.Request{Family: "summarize", Variant: "digest", Input: "hello", Cache: true, Config: &task.GenConfig{Temperature: new(0.3)}})
	if r2.TaskID == r.TaskID || len(r2.TaskID) != 32 {
		t.Fatalf("second id %q (first %q)", r2.TaskID, r.TaskID)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	req := validRequest()
	first, err := e.api.SubmitWithKey(ctx, "intent-1", req)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v %v", first, err)
	}
	code, h, body := e.do("POST", "/v1/tasks", e.key, mustJSON(t, req), map[string]string{task.HeaderIdempotencyKey: "intent-1"})
	var again task.SubmitResponse
	_ = json.Unmarshal(body, &again)
	if code != http.StatusOK || h.Get(task.HeaderReplayed) != "true" || again.TaskID != first.TaskID {
		t.Fatalf("replay: %d %q %s", code, h.Get(task.HeaderReplayed), body)
	}
	// The same key with another body is a 422.
	other := validRequest()
	other.Input = "something else"
	code, h, body = e.do("POST", "/v1/tasks", e.key, mustJSON(t, other), map[string]string{task.HeaderIdempotencyKey: "intent-1"})
	if p := problemOf(t, h, body); code != http.StatusUnprocessableEntity || !slices.Contains(fields(p), task.HeaderIdempotencyKey) {
		t.Fatalf("different body: %d %s", code, body)
	}
	// A retry after run_before has passed still finds its task.
	soon := validRequest()
	soon.RunBefore = new(time.Now().Add(2 * time.Second))
	accepted, err := e.api.SubmitWithKey(ctx, "intent-soon", soon)
	if err != nil {
		t.Fatal(err)
	}
	later := *e.st
	later.Now = func() time.Time { return time.Now().Add(time.Minute) }
	srv, err := New(e.cfg, Deps{Store: &later, Publisher: e.pub, Families: testFamilies})
	if err != nil {
		t.Fatal(err)
	}
	res, err := srv.submit(ctx, e.tenant, "intent-soon", &soon)
	if err != nil || !res.replayed || res.t.ID != accepted.TaskID {
		t.Fatalf("retry past run_before: %+v %v", res, err)
	}
	if _, err := srv.submit(ctx, e.tenant, "", &soon); err == nil {
		t.Fatal("a new request past run_before was accepted")
	}
	// The same key of another tenant is another task.
	_, key2 := e.newTenant("globex", nil)
	r2, err := client.New(e.url, key2).SubmitWithKey(ctx, "intent-1", req)
	if err != nil || r2.TaskID == first.TaskID || r2.Replayed {
		t.Fatalf("other tenant: %+v %v", r2, err)
	}
	if n := len(e.pub.On(bus.TopicTasks)); n != 3 {
		t.Fatalf("%d nudges, want one per created task (3)", n)
	}
	// A key that is not printable ASCII, or too long, is refused naming the header.
	for _, bad := range []string{"has space", strings.Repeat("k", 256)} {
		code, h, body := e.do("POST", "/v1/tasks", e.key, mustJSON(t, req), map[string]string{task.HeaderIdempotencyKey: bad})
		if p := problemOf(t, h, body); code != 400 || !slices.Contains(fields(p), task.HeaderIdempotencyKey) {
			t.Fatalf("key %q: %d %s", bad, code, body)
		}
	}
}

func TestIdempotencyKeyConcurrent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 16
	var wg sync.WaitGroup
	res := make([]*task.SubmitResponse, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { res[i], errs[i] = e.api.SubmitWithKey(context.Background(), "same-intent", validRequest()) })
	}
	wg.Wait()
	created := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if res[i].TaskID != res[0].TaskID {
			t.Fatalf("request %d made task %s, request 0 %s", i, res[i].TaskID, res[0].TaskID)
		}
		if !res[i].Replayed {
			created++
		}
	}
	if created != 1 {
		t.Fatalf("%d requests created the task, want 1", created)
	}
	if got := len(e.pub.On(bus.TopicTasks)); got != 1 {
		t.Fatalf("%d nudges, want 1", got)
	}
	list, err := e.api.List(context.Background(), client.ListOptions{})
	if err != nil || len(list.Tasks) != 1 {
		t.Fatalf("list: %+v %v", list, err)
	}
}

func TestSubmitValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	withReq := func(f func(r map[string]any)) []byte {
		r := map[string]any{"family": "summarize", "input": "x"}
		f(r)
		return mustJSON(t, r)
	}
	past := time.Now().Add(-time.Minute).Format(time.RFC3339)
	labels33 := map[string]any{}
	for i := range 33 {
		labels33["k"+strings.Repeat("a", i)] = "v"
	}
	cases := []struct {
		name   string
		body   []byte
		ctype  string
		status int
		field  string // "" when the problem names no field
	}{
		{"empty body", []byte{}, "", 400, ""},
		{"malformed", []byte(`{"family":`), "", 400, ""},
		{"not an object", []byte(`[1]`), "", 400, ""},
		{"trailing data", []byte(`{"family":"summarize","input":"x"} {}`), "", 400, ""},
		{"unknown field", withReq(func(r map[string]any) { r["colour"] = "red" }), "", 400, "colour"},
		{"unknown nested field", withReq(func(r map[string]any) { r["config"] = map[string]any{"seed": 1} }), "", 400, "seed"},
		{"wrong type", withReq(func(r map[string]any) { r["config"] = map[string]any{"temperature": "hot"} }), "", 400, "config.temperature"},
		{"wrong type top level", withReq(func(r map[string]any) { r["cache"] = "yes" }), "", 400, "cache"},
		{"run_before not RFC 3339", withReq(func(r map[string]any) { r["run_before"] = "tomorrow" }), "", 400, "run_before"},
		{"run_before a number", withReq(func(r map[string]any) { r["run_before"] = 5 }), "", 400, "run_before"},
		{"run_before past", withReq(func(r map[string]any) { r["run_before"] = past }), "", 400, "run_before"},
		{"family missing", withReq(func(r map[string]any) { delete(r, "family") }), "", 400, "family"},
		{"family unknown", withReq(func(r map[string]any) { r["family"] = "poetry" }), "", 400, "family"},
		{"family malformed", withReq(func(r map[string]any) { r["family"] = "Sum Marize" }), "", 400, "family"},
		{"variant unknown", withReq(func(r map[string]any) { r["variant"] = "long" }), "", 400, "variant"},
		{"input missing", withReq(func(r map[string]any) { delete(r, "input") }), "", 400, "input"},
		{"input too large", withReq(func(r map[string]any) { r["input"] = strings.Repeat("a", MaxInputBytes+1) }), "", 400, "input"},
		{"invalid UTF-8", []byte("{\"family\":\"summarize\",\"input\":\"\xff\xfe\"}"), "", 400, ""},
		{"body too large", withReq(func(r map[string]any) { r["input"] = strings.Repeat("a", 1<<20) }), "", 413, ""},
		{"not JSON media type", withReq(func(map[string]any) {}), "text/plain", 415, ""},
		{"temperature", withReq(func(r map[string]any) { r["config"] = map[string]any{"temperature": 2.5} }), "", 400, "config.temperature"},
		{"top_p", withReq(func(r map[string]any) { r["config"] = map[string]any{"top_p": 1.5} }), "", 400, "config.top_p"},
		{"top_k", withReq(func(r map[string]any) { r["config"] = map[string]any{"top_k": 0} }), "", 400, "config.top_k"},
		{"top_k fraction", withReq(func(r map[string]any) { r["config"] = map[string]any{"top_k": 1.5} }), "", 400, "config.top_k"},
		{"max_output_tokens", withReq(func(r map[string]any) { r["config"] = map[string]any{"max_output_tokens": 70000} }), "", 400, "config.max_output_tokens"},
		{"max_output_tokens over the family's limit", withReq(func(r map[string]any) { r["config"] = map[string]any{"max_output_tokens": 4097} }), "", 400, "config.max_output_tokens"},
		{"callback http", withReq(func(r map[string]any) { r["callback_url"] = "http://example.com/hook" }), "", 422, "callback_url"},
		{"callback private", withReq(func(r map[string]any) { r["callback_url"] = "https://169.254.169.254/" }), "", 422, "callback_url"},
		{"callback loopback", withReq(func(r map[string]any) { r["callback_url"] = "https://127.0.0.1:8443/hook" }), "", 422, "callback_url"},
		{"callback localhost", withReq(func(r map[string]any) { r["callback_url"] = "https://localhost/hook" }), "", 422, "callback_url"},
		{"callback private range", withReq(func(r map[string]any) { r["callback_url"] = "https://10.1.2.3/hook" }), "", 422, "callback_url"},
		{"callback mapped IPv6", withReq(func(r map[string]any) { r["callback_url"] = "https://[::ffff:127.0.0.1]/hook" }), "", 422, "callback_url"},
		{"callback decimal IPv4", withReq(func(r map[string]any) { r["callback_url"] = "https://2130706433/hook" }), "", 422, "callback_url"},
		{"callback hex IPv4", withReq(func(r map[string]any) { r["callback_url"] = "https://0x7f.1/hook" }), "", 422, "callback_url"},
		{"callback short IPv4", withReq(func(r map[string]any) { r["callback_url"] = "https://127.1/hook" }), "", 422, "callback_url"},
		{"callback zero host", withReq(func(r map[string]any) { r["callback_url"] = "https://0/hook" }), "", 422, "callback_url"},
		{"callback metadata name", withReq(func(r map[string]any) { r["callback_url"] = "https://metadata.google.internal/computeMetadata/v1/" }), "", 422, "callback_url"},
		{"callback internal name", withReq(func(r map[string]any) { r["callback_url"] = "https://billing.internal/hook" }), "", 422, "callback_url"},
		{"callback compatible IPv6", withReq(func(r map[string]any) { r["callback_url"] = "https://[::7f00:1]/hook" }), "", 422, "callback_url"},
		{"callback site-local IPv6", withReq(func(r map[string]any) { r["callback_url"] = "https://[fec0::1]/hook" }), "", 422, "callback_url"},
		{"callback teredo", withReq(func(r map[string]any) { r["callback_url"] = "https://[2001::1]/hook" }), "", 422, "callback_url"},
		{"callback discard IPv6", withReq(func(r map[string]any) { r["callback_url"] = "https://[100::1]/hook" }), "", 422, "callback_url"},
		{"callback port not allowed", withReq(func(r map[string]any) { r["callback_url"] = "https://example.com:6379/hook" }), "", 422, "callback_url"},
		{"callback not a URL", withReq(func(r map[string]any) { r["callback_url"] = "::nope" }), "", 400, "callback_url"},
		{"callback refused beside a bad field", withReq(func(r map[string]any) { r["callback_url"] = "https://127.1/"; r["max_cost_usd"] = 0 }), "", 400, "callback_url"},
		{"too many labels", withReq(func(r map[string]any) { r["labels"] = labels33 }), "", 400, "labels"},
		{"label key charset", withReq(func(r map[string]any) { r["labels"] = map[string]any{"Bad Key": "v"} }), "", 400, "labels.Bad Key"},
		{"label value control", withReq(func(r map[string]any) { r["labels"] = map[string]any{"k": "a\nb"} }), "", 400, "labels.k"},
		{"label value type", withReq(func(r map[string]any) { r["labels"] = map[string]any{"k": 1} }), "", 400, "labels"},
		{"max_cost zero", withReq(func(r map[string]any) { r["max_cost_usd"] = 0 }), "", 400, "max_cost_usd"},
		{"max_cost negative", withReq(func(r map[string]any) { r["max_cost_usd"] = -1 }), "", 400, "max_cost_usd"},
		{"subject_key too long", withReq(func(r map[string]any) { r["subject_key"] = strings.Repeat("s", 513) }), "", 400, "subject_key"},
		{"mode unknown", withReq(func(r map[string]any) { r["mode"] = "eventually" }), "", 400, "mode"},
		{"priority above", withReq(func(r map[string]any) { r["priority"] = task.MaxPriority + 1 }), "", 400, "priority"},
		{"priority below", withReq(func(r map[string]any) { r["priority"] = task.MinPriority - 1 }), "", 400, "priority"},
	}
	for _, c := range cases { //nolint:paralleltest // the check after the loop counts the nudges every case published
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.ctype != "" {
				hdr["Content-Type"] = c.ctype
			}
			code, h, body := e.do("POST", "/v1/tasks", e.key, c.body, hdr)
			if code != c.status {
				t.Fatalf("status %d, want %d: %s", code, c.status, body)
			}
			p := problemOf(t, h, body)
			if p.Status != c.status || !strings.HasPrefix(p.Type, httpapi.ProblemBase) || p.Title == "" {
				t.Fatalf("problem %+v", p)
			}
			if c.field != "" && !slices.Contains(fields(p), c.field) {
				t.Fatalf("problem names %v, want %q: %s", fields(p), c.field, body)
			}
		})
	}
	if n := len(e.pub.On(bus.TopicTasks)); n != 0 {
		t.Fatalf("refused requests published %d nudges", n)
	}
	// Within the bounds everything is accepted.
	ok := task.Request{Family: "summarize", Input: strings.Repeat("é", MaxInputBytes/2), SubjectKey: "site-a/daily",
		CallbackURL: "https://example.com/hook", Labels: map[string]string{"app": "x", "team.name": "Ünïcode value"},
		Config:    &task.GenConfig{Temperature: new(2.0), TopP: new(0.0), TopK: new(int32(100)), MaxOutputTokens: new(int32(4096))},
		RunBefore: new(time.Now().Add(time.Hour)), MaxCostUSD: new(0.05), Priority: new(task.MaxPriority)}
	v, err := e.api.Submit(context.Background(), ok)
	if err != nil {
		t.Fatalf("request at the bounds: %v", err)
	}
	priority := func(id string) int {
		d, err := e.st.GetTask(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return d.Priority
	}
	if got := priority(v.TaskID); got != task.MaxPriority {
		t.Errorf("stored priority %d, want the request's %d", got, task.MaxPriority)
	}
	if got := priority(e.submit(validRequest()).TaskID); got != task.DefaultPriority {
		t.Errorf("stored priority %d of a request without one, want %d", got, task.DefaultPriority)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	r := e.submit(validRequest())
	for _, c := range []struct{ name, key string }{{"no key", ""}, {"unknown key", "gbx_nope"}, {"admin key", testAdminKey}} {
		code, h, body := e.do("GET", "/v1/tasks/"+r.TaskID, c.key, nil, nil)
		if p := problemOf(t, h, body); code != 401 || p.Status != 401 || h.Get("WWW-Authenticate") == "" {
			t.Fatalf("%s: %d %s", c.name, code, body)
		}
	}
	// Another tenant sees none of acme's tasks.
	_, key2 := e.newTenant("globex", nil)
	other := client.New(e.url, key2, client.WithRetries(0))
	var p *task.Problem
	if _, err := other.Get(ctx, r.TaskID); !errors.As(err, &p) || p.Status != 404 {
		t.Fatalf("other tenant get: %v", err)
	}
	if _, err := other.Cancel(ctx, r.TaskID); !errors.As(err, &p) || p.Status != 404 {
		t.Fatalf("other tenant cancel: %v", err)
	}
	e.finish(r.TaskID, task.StateSucceeded)
	if err := other.Delete(ctx, r.TaskID); !errors.As(err, &p) || p.Status != 404 {
		t.Fatalf("other tenant delete: %v", err)
	}
	if l, err := other.List(ctx, client.ListOptions{}); err != nil || len(l.Tasks) != 0 {
		t.Fatalf("other tenant list: %+v %v", l, err)
	}
	if v, err := e.api.Get(ctx, r.TaskID); err != nil || v.Output == nil {
		t.Fatalf("owner still reads its task: %+v %v", v, err)
	}
	// A revoked key fails on the very next request.
	k, err := e.admin.CreateAPIKey(ctx, e.tenant)
	if err != nil {
		t.Fatal(err)
	}
	c3 := client.New(e.url, k.Key, client.WithRetries(0))
	if _, err := c3.Get(ctx, r.TaskID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RevokeAPIKey(ctx, k.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Get(ctx, r.TaskID); !errors.As(err, &p) || p.Status != 401 {
		t.Fatalf("revoked key: %v", err)
	}
	if _, err := e.api.Get(ctx, r.TaskID); err != nil {
		t.Fatalf("the tenant's other key still works: %v", err)
	}
	// Keys are stored only as hashes.
	snap, err := e.st.APIKeys().Doc(store.APIKeyID(k.Key)).Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for f, v := range snap.Data() {
		if s, ok := v.(string); ok && strings.Contains(s, k.Key) {
			t.Fatalf("field %s holds the key", f)
		}
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var p *task.Problem
	plain := e.submit(validRequest())
	v, err := e.api.Cancel(ctx, plain.TaskID)
	if err != nil || v.State != task.StateCancelled || v.CompletedAt == nil || v.Delivery.State != task.DeliveryNone {
		t.Fatalf("cancel: %+v %v", v, err)
	}
	if _, err := e.api.Cancel(ctx, plain.TaskID); !errors.As(err, &p) || p.Status != 409 {
		t.Fatalf("cancel a cancelled task: %v", err)
	}
	// With a callback, cancel queues task.cancelled and nudges the result handler.
	req := validRequest()
	req.CallbackURL = "https://example.com/hook"
	hooked := e.submit(req)
	if _, err := e.api.Cancel(ctx, hooked.TaskID); err != nil {
		t.Fatal(err)
	}
	doc, err := e.st.GetTask(ctx, hooked.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Delivery.State != task.DeliveryPending || doc.Delivery.EventID != task.EventID(hooked.TaskID, task.EventCancelled, 0) || doc.DueAt == nil {
		t.Fatalf("delivery %+v due %v", doc.Delivery, doc.DueAt)
	}
	if msgs := e.pub.On(bus.TopicResults); len(msgs) != 1 || msgs[0].Attrs[task.AttrTaskID] != hooked.TaskID {
		t.Fatalf("results nudges %+v", msgs)
	}
	// Waiting can be cancelled; running cannot, unless in a batch job (its answer will only
	// record its cost).
	for _, c := range []struct {
		state task.State
		owner string
		code  int
	}{{task.StateWaiting, "", 200}, {task.StateRunning, "w1", 409}, {task.StateRunning, protocol.BatchOwner("bj1"), 200}, {task.StateSucceeded, "", 409}} {
		r := e.submit(validRequest())
		if _, err := e.st.MutateTask(ctx, r.TaskID, func(t *protocol.Task, now time.Time) error {
			t.State = c.state
			if c.state == task.StateRunning {
				exp := now.Add(time.Minute)
				t.Lease.Owner, t.Lease.ExpiresAt = c.owner, &exp
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		_, err := e.api.Cancel(ctx, r.TaskID)
		switch {
		case c.code == 200 && err != nil:
			t.Fatalf("cancel %s: %v", c.state, err)
		case c.code != 200 && (!errors.As(err, &p) || p.Status != c.code):
			t.Fatalf("cancel %s: %v, want %d", c.state, err, c.code)
		}
	}
	if _, err := e.api.Cancel(ctx, "no-such-task"); !errors.As(err, &p) || p.Status != 404 {
		t.Fatalf("cancel a missing task: %v", err)
	}
}

func TestDelete(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var p *task.Problem
	req := validRequest()
	req.CallbackURL = "https://example.com/hook"
	r := e.submit(req)
	if err := e.api.Delete(ctx, r.TaskID); !errors.As(err, &p) || p.Status != 409 {
		t.Fatalf("delete a queued task: %v", err)
	}
	done := e.finish(r.TaskID, task.StateSucceeded)
	// What the worker left: the cache entry and the last good output of the task's subject; and
	// another task's last good output of another subject, which must stay.
	other := e.submit(validRequest())
	e.finish(other.TaskID, task.StateSucceeded)
	for id, subject := range map[string]string{r.TaskID: "site-a", other.TaskID: "site-b"} {
		rem := store.Remembered{Output: store.Output{Tenant: e.tenant, Payload: "the output", TaskID: id},
			Family: "summarize", Variant: "default", SubjectKey: subject}
		if id == r.TaskID {
			rem.Fingerprint = done.Fingerprint
		}
		if err := e.st.Remember(ctx, rem); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(done.Delivery.Payload, "the output") {
		t.Fatalf("the frozen payload should carry the output before erasure: %s", done.Delivery.Payload)
	}
	for i := range 2 { // erasing twice is fine
		if err := e.api.Delete(ctx, r.TaskID); err != nil {
			t.Fatalf("delete #%d: %v", i+1, err)
		}
	}
	doc, err := e.st.GetTask(ctx, r.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Input != "" || doc.Output != "" || doc.Previous[0].Output != "" || doc.ErasedAt == nil ||
		strings.Contains(doc.Delivery.Payload, "the output") || doc.Delivery.EventID == "" {
		t.Fatalf("content left after erasure: %+v", doc)
	}
	if doc.Usage.TotalTokens != 30 || doc.CostUSD != 0.001 || doc.State != task.StateSucceeded || doc.RequestHash == "" {
		t.Fatalf("accounting lost: %+v", doc)
	}
	var ev task.Event
	if err := json.Unmarshal([]byte(doc.Delivery.Payload), &ev); err != nil || ev.Type != task.EventSucceeded || ev.Data.TaskID != r.TaskID {
		t.Fatalf("payload after erasure %s: %v", doc.Delivery.Payload, err)
	}
	if _, err := e.st.FS.Collection(store.OutputsCollection).Doc(done.Fingerprint).Get(ctx); err == nil {
		t.Fatal("the cache entry survived")
	}
	if _, err := e.st.GetLastGood(ctx, e.tenant, "summarize", "default", "site-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the task's last good output survived: %v", err)
	}
	if _, err := e.st.GetLastGood(ctx, e.tenant, "summarize", "default", "site-b"); err != nil {
		t.Fatalf("another task's last good output: %v, want kept", err)
	}
	v, err := e.api.Get(ctx, r.TaskID)
	if err != nil || v.Output != nil || v.Usage.TotalTokens != 30 {
		t.Fatalf("view after erasure: %+v %v", v, err)
	}
	// A dead task may still be regenerated by a human: erase it only after a discard.
	dead := e.submit(validRequest())
	e.finish(dead.TaskID, task.StateDead)
	if err := e.api.Delete(ctx, dead.TaskID); !errors.As(err, &p) || p.Status != 409 {
		t.Fatalf("delete a dead task: %v", err)
	}
	if err := e.api.Delete(ctx, "no-such-task"); !errors.As(err, &p) || p.Status != 404 {
		t.Fatalf("delete a missing task: %v", err)
	}
}

// A streamed task's preview (previews/{id}) can hold the whole output for an hour after its
// last write: DELETE erases it with the rest of the task's content.
func TestDeleteErasesThePreview(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	req := validRequest()
	req.Stream = true
	id := e.submit(req).TaskID
	// What the worker's streamed call left: the text so far, here the whole output.
	if err := e.st.SavePreview(ctx, id, store.Preview{Epoch: 1, Text: "the output"}); err != nil {
		t.Fatal(err)
	}
	e.finish(id, task.StateSucceeded)
	if err := e.api.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	snap, err := e.st.FS.Collection(store.PreviewsCollection).Doc(id).Get(ctx)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("previews/%s after the erase: %v (%v), want it gone", id, snap.Data(), err)
	}
}

// A task whose webhook died may be erased by its tenant: DELETE discards its open delivery dead
// letter (a dead delivery bills nothing), recorded as the tenant's erase with its Slack message
// queued for an update, sends the next queued event (output erased) as a human's Discard would,
// and erases the task, which can then expire. Before, the DELETE answered 409 until an operator
// decided, and floods of such dead letters are not paged task by task.
func TestDeleteDiscardsTheDeadDelivery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	req := validRequest()
	req.CallbackURL = "https://example.com/hook"
	id := e.submit(req).TaskID
	e.finish(id, task.StateSucceeded)
	var dlID string
	_, err := e.st.MutateTask(ctx, id, func(tk *protocol.Task, _ time.Time) error {
		// The webhook died, the dlqnotifier recorded its dead letter and posted it; an event
		// queued behind it waits.
		tk.Delivery.State, tk.Delivery.LastStatus, tk.Delivery.NextAttemptAt = task.DeliveryDead, 404, nil
		n := protocol.Notice{Stage: task.StageDelivery, Event: tk.Delivery.EventID}
		dlID = n.DeadLetterID(id)
		tk.OpenDeadLetters = []string{dlID}
		tk.Delivery.Queue = []protocol.QueuedEvent{{EventID: id + ".next", Type: task.EventSucceeded, Payload: tk.Delivery.Payload}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.DeadLetters().Doc(dlID).Set(ctx, store.DeadLetter{TaskID: id, Tenant: e.tenant, Stage: task.StageDelivery,
		State: store.DeadLetterOpen, SlackChannel: "C1", SlackTS: "1.2", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	e.pub.Take()

	if err := e.api.Delete(ctx, id); err != nil {
		t.Fatalf("delete a task whose webhook died: %v, want it erased", err)
	}
	d, err := e.st.GetDeadLetter(ctx, dlID)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.DeadLetterDiscarded || d.DecidedBy != store.ErasedBy(e.tenant) || d.DecidedAt == nil || !d.Applied {
		t.Errorf("dead letter %s: %s by %q at %v, applied %v; want discarded by %q", dlID, d.State, d.DecidedBy, d.DecidedAt, d.Applied, store.ErasedBy(e.tenant))
	}
	got, err := e.st.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.ErasedAt == nil || got.Input != "" || got.Output != "" || strings.Contains(got.Delivery.Payload, "the output") {
		t.Errorf("task content left after the erase: input %q output %q payload %s", got.Input, got.Output, got.Delivery.Payload)
	}
	if len(got.OpenDeadLetters) != 0 || got.SlackUpdate == nil || !slices.Equal(got.SlackUpdate.Keys, []string{dlID}) {
		t.Errorf("open dead letters %v, Slack update %+v; want none open and %s's message to update", got.OpenDeadLetters, got.SlackUpdate, dlID)
	}
	if got.Delivery.State != task.DeliveryPending || got.Delivery.EventID != id+".next" {
		t.Errorf("delivery %s of %s, want the queued event pending", got.Delivery.State, got.Delivery.EventID)
	}
	if n := len(e.pub.On(bus.TopicResults)); n != 1 {
		t.Errorf("%d results nudges, want 1 for the queued event", n)
	}
	// The next DELETE has nothing left to discard; a generation dead letter still answers 409
	// (TestDelete).
	if err := e.api.Delete(ctx, id); err != nil {
		t.Fatalf("delete again: %v", err)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var ids []string
	for range 5 {
		ids = append(ids, e.submit(validRequest()).TaskID)
	}
	if _, err := e.api.Cancel(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.api.Cancel(ctx, ids[3]); err != nil {
		t.Fatal(err)
	}
	e.finish(ids[4], task.StateSucceeded)
	var got []string
	for v, err := range e.api.All(ctx, client.ListOptions{Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, v.TaskID)
		// A listing reads only what a view shows: it must show the same.
		if full, err := e.api.Get(ctx, v.TaskID); err != nil || !reflect.DeepEqual(v, *full) {
			t.Fatalf("listed %+v, GET %+v (%v)", v, full, err)
		}
	}
	want := slices.Clone(ids)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want newest first %v", got, want)
	}
	full, err := e.api.Get(ctx, ids[3])
	if err != nil {
		t.Fatal(err)
	}
	page, err := e.api.List(ctx, client.ListOptions{State: task.StateCancelled, Limit: 1})
	if err == nil && len(page.Tasks) == 1 && !reflect.DeepEqual(page.Tasks[0], *full) {
		t.Fatalf("listed view %+v differs from GET %+v", page.Tasks[0], *full)
	}
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].TaskID != ids[3] || page.NextPageToken == "" {
		t.Fatalf("cancelled page 1: %+v %v", page, err)
	}
	page2, err := e.api.List(ctx, client.ListOptions{State: task.StateCancelled, Limit: 1, PageToken: page.NextPageToken})
	if err != nil || len(page2.Tasks) != 1 || page2.Tasks[0].TaskID != ids[1] {
		t.Fatalf("cancelled page 2: %+v %v", page2, err)
	}
	if page3, err := e.api.List(ctx, client.ListOptions{State: task.StateCancelled, Limit: 1, PageToken: page2.NextPageToken}); err != nil || len(page3.Tasks) != 0 && page2.NextPageToken != "" {
		t.Fatalf("cancelled page 3: %+v %v", page3, err)
	}
	for _, c := range []struct{ query, field string }{
		{"state=bogus", "state"}, {"limit=0", "limit"}, {"limit=101", "limit"}, {"limit=x", "limit"},
		{"page_token=!!", "page_token"}, {"state=queued&page_token=" + page.NextPageToken, "page_token"},
	} {
		code, h, body := e.do("GET", "/v1/tasks?"+c.query, e.key, nil, nil)
		if p := problemOf(t, h, body); code != 400 || !slices.Contains(fields(p), c.field) {
			t.Fatalf("%s: %d %s", c.query, code, body)
		}
	}
}

func TestBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := []byte(`{"tasks":[{"family":"summarize","input":"a"},{"family":"summarize","input":"b","colour":"red"},` +
		`{"family":"poetry","input":"c"},{"family":"classify","input":"d"}]}`)
	hdr := map[string]string{task.HeaderIdempotencyKey: "batch-1"}
	code, _, out := e.do("POST", "/v1/tasks:batch", e.key, body, hdr)
	if code != 200 {
		t.Fatalf("batch: %d %s", code, out)
	}
	var res task.BatchResponse
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	wantStatus := []int{202, 400, 400, 202}
	wantField := []string{"", "colour", "family", ""}
	if len(res.Results) != 4 {
		t.Fatalf("results %+v", res.Results)
	}
	for i, r := range res.Results {
		if r.Index != i || r.Status != wantStatus[i] {
			t.Fatalf("item %d: %+v, want status %d", i, r, wantStatus[i])
		}
		if wantField[i] != "" && (r.Problem == nil || !slices.Contains(fields(*r.Problem), wantField[i])) {
			t.Fatalf("item %d: problem %+v, want field %s", i, r.Problem, wantField[i])
		}
		if wantField[i] == "" && (r.TaskID == "" || r.State != task.StateQueued || r.StatusURL == "") {
			t.Fatalf("item %d: %+v", i, r)
		}
	}
	// The same batch under the same key makes no new task.
	_, _, out = e.do("POST", "/v1/tasks:batch", e.key, body, hdr)
	var again task.BatchResponse
	if err := json.Unmarshal(out, &again); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 3} {
		if r := again.Results[i]; r.Status != 200 || !r.Replayed || r.TaskID != res.Results[i].TaskID {
			t.Fatalf("replayed item %d: %+v", i, r)
		}
	}
	if n := len(e.pub.On(bus.TopicTasks)); n != 2 {
		t.Fatalf("%d nudges, want 2", n)
	}
	// The client's batch.
	cr, err := e.api.SubmitBatch(context.Background(), []task.Request{validRequest(), validRequest()})
	if err != nil || len(cr.Results) != 2 || cr.Results[0].Status != 202 || cr.Results[0].TaskID == cr.Results[1].TaskID {
		t.Fatalf("client batch: %+v %v", cr, err)
	}
	many := task.BatchRequest{Tasks: make([]task.Request, task.MaxBatch+1)}
	for _, c := range []struct {
		name string
		body []byte
	}{{"empty", []byte(`{"tasks":[]}`)}, {"too many", mustJSON(t, many)}, {"unknown field", []byte(`{"tasks":[],"x":1}`)}} {
		code, h, out := e.do("POST", "/v1/tasks:batch", e.key, c.body, nil)
		if p := problemOf(t, h, out); code != 400 || p.Status != 400 {
			t.Fatalf("%s: %d %s", c.name, code, out)
		}
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, key := e.newTenant("slow", &task.Limits{SubmitRate: 0.001, SubmitBurst: 2})
	for i := range 2 {
		if code, _, body := e.do("POST", "/v1/tasks", key, mustJSON(t, validRequest()), nil); code != 202 {
			t.Fatalf("submission %d within the burst: %d %s", i, code, body)
		}
	}
	code, h, body := e.do("POST", "/v1/tasks", key, mustJSON(t, validRequest()), nil)
	if p := problemOf(t, h, body); code != 429 || p.Type != httpapi.ProblemBase+httpapi.TypeRateLimited || h.Get("Retry-After") == "" || h.Get("Retry-After") == "0" {
		t.Fatalf("over the rate: %d Retry-After %q %s", code, h.Get("Retry-After"), body)
	}
	// Another tenant is not affected, and a batch refuses only the items over the rate.
	if code, _, body := e.do("POST", "/v1/tasks", e.key, mustJSON(t, validRequest()), nil); code != 202 {
		t.Fatalf("other tenant: %d %s", code, body)
	}
	code, _, body = e.do("POST", "/v1/tasks:batch", key, mustJSON(t, task.BatchRequest{Tasks: []task.Request{validRequest()}}), nil)
	var res task.BatchResponse
	if err := json.Unmarshal(body, &res); err != nil || code != 200 || res.Results[0].Status != 429 {
		t.Fatalf("batch over the rate: %d %s", code, body)
	}
	// Raising the limit applies at once on this instance.
	if _, err := e.admin.SetLimits(context.Background(), "slow", task.Limits{SubmitRate: 100, SubmitBurst: 10}); err != nil {
		t.Fatal(err)
	}
	if code, _, body := e.do("POST", "/v1/tasks", key, mustJSON(t, validRequest()), nil); code != 202 {
		t.Fatalf("after raising the limit: %d %s", code, body)
	}
}

// TestPublishFailureStillAccepts shows the write-first rule: with Pub/Sub unavailable the task
// is accepted, and it is due at now+grace so the sweeper nudges it.
func TestPublishFailureStillAccepts(t *testing.T) {
	t.Parallel()
	unavailable := errors.New("pubsub: unavailable")
	e := setup(t, func(_ *Config, d *Deps) {
		failing := &testenv.Publisher{}
		failing.SetPublishFunc(func(context.Context, string, []byte, map[string]string) error { return unavailable })
		d.Publisher = failing
	})
	before := time.Now().UTC()
	r := e.submit(validRequest())
	doc, err := e.st.GetTask(context.Background(), r.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if doc.State != task.StateQueued || doc.DueAt == nil || doc.DueAt.Before(before) || doc.DueAt.After(time.Now().Add(e.cfg.NudgeGrace)) {
		t.Fatalf("state %s due_at %v, want queued and due by now+%s", doc.State, doc.DueAt, e.cfg.NudgeGrace)
	}
	// The sweep query (due_at <= t) finds it once the grace has passed.
	it := e.st.Tasks().Where("due_at", "<=", time.Now().Add(e.cfg.NudgeGrace+time.Second)).OrderBy("due_at", firestore.Asc).Documents(context.Background())
	snaps, err := it.GetAll()
	if err != nil || len(snaps) != 1 || snaps[0].Ref.ID != r.TaskID {
		t.Fatalf("sweep query: %d docs, %v", len(snaps), err)
	}
}

func TestNotARoute(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, c := range []struct {
		method, path string
		code         int
		slug         string
	}{
		{"GET", "/nope", 404, httpapi.TypeNoRoute},
		{"POST", "/v1/tasks/abc:bogus", 404, httpapi.TypeNoRoute},
		{"POST", "/v1/tasks/abc", 404, httpapi.TypeNoRoute},
		{"PUT", "/v1/tasks", 405, httpapi.TypeMethod},
		{"GET", "/v1/tasks/abc:cancel", 404, httpapi.TypeNotFound},   // a task id that does not exist
		{"GET", "/v1/tasks/__reserved__", 404, httpapi.TypeNotFound}, // never reaches Firestore
		{"DELETE", "/v1/tasks/..", 404, httpapi.TypeNoRoute},
	} {
		code, h, body := e.do(c.method, c.path, e.key, nil, nil)
		if p := problemOf(t, h, body); code != c.code || p.Type != httpapi.ProblemBase+c.slug {
			t.Fatalf("%s %s: %d %s", c.method, c.path, code, body)
		}
	}
}

// TestCallbackPorts: a callback URL must name a port of GENBOX_CALLBACK_PORTS (its scheme's
// default when it names none); one outside is refused as callback-url-refused (422).
func TestCallbackPorts(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config, _ *Deps) { c.CallbackPorts = []uint16{9443} })
	req := validRequest()
	req.CallbackURL = "https://example.com:9443/hook"
	if _, err := e.api.Submit(context.Background(), req); err != nil {
		t.Fatalf("a configured port: %v", err)
	}
	req.CallbackURL = "https://example.com/hook"
	var p *task.Problem
	_, err := e.api.Submit(context.Background(), req)
	if !errors.As(err, &p) {
		t.Fatalf("port 443 outside the list: %v, want a problem", err)
	}
	if diff := cmp.Diff([]string{"callback_url"}, fields(*p)); p.Status != 422 || p.Type != httpapi.ProblemBase+probCallbackRefused || diff != "" {
		t.Fatalf("problem %+v, want 422 %s naming callback_url (-want +got fields):\n%s", p, probCallbackRefused, diff)
	}
}

// TestInsecureCallbacksForLocalUse: GENBOX_ALLOW_INSECURE_CALLBACKS admits http and loopback
// (for `genbox dev`), still not the metadata server.
func TestInsecureCallbacksForLocalUse(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config, _ *Deps) { c.AllowInsecureCallbacks = true })
	req := validRequest()
	req.CallbackURL = "http://127.0.0.1:9999/hook"
	if _, err := e.api.Submit(context.Background(), req); err != nil {
		t.Fatalf("loopback http with insecure callbacks allowed: %v", err)
	}
	req.CallbackURL = "http://169.254.169.254/computeMetadata/v1/"
	var p *task.Problem
	if _, err := e.api.Submit(context.Background(), req); !errors.As(err, &p) || !slices.Contains(fields(*p), "callback_url") {
		t.Fatalf("metadata address: %v", err)
	}
}

// A field of the wrong type is named with the JSON type it takes, whatever Go type holds it: a
// mode is a string, the config an object.
func TestWrongTypeNamesTheJSONType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ body, want string }{
		{`{"family":"summarize","input":"x","mode":5}`, "mode: must be a string, not number"},
		{`{"family":"summarize","input":"x","config":"hot"}`, "config: must be an object, not string"},
		{`{"family":"summarize","input":"x","config":{"top_k":"many"}}`, "config.top_k: must be an integer, not string"},
		{`{"family":"summarize","input":"x","config":{"temperature":"hot"}}`, "config.temperature: must be a number, not string"},
		{`{"family":"summarize","input":"x","cache":"yes"}`, "cache: must be a boolean, not string"},
		{`{"family":"summarize","input":"x","labels":["a"]}`, "labels: must be an object, not array"},
		{`["summarize"]`, "the body must be an object, not array"},
	} {
		var req task.Request
		err := decodeStrict([]byte(tc.body), &req)
		var p *task.Problem
		if !errors.As(err, &p) || p.Detail != tc.want {
			t.Errorf("%s: %v, want the detail %q", tc.body, err, tc.want)
		}
	}
}

// A task submitted while its tenant's slots are all taken (the publisher read them so, in the
// background of an earlier submission) is created waiting for one — the worker's claim has
// nothing to mark — and nudged all the same: the worker that takes the nudge rechecks the count
// (a slot may have freed since the publisher read it). A task of a higher priority is not.
func TestSubmitAtTheCapCreatesTheTaskWaiting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	limits, err := e.st.GetTenant(ctx, e.tenant)
	if err != nil {
		t.Fatal(err)
	}
	limits.Limits.Concurrency = 1
	if _, err := e.st.SetTenantLimits(ctx, e.tenant, limits.Limits); err != nil {
		t.Fatal(err)
	}
	if err := e.st.CreateTask(ctx, &protocol.Task{ID: "holder", Tenant: e.tenant, State: task.StateQueued}); err != nil {
		t.Fatal(err)
	}
	c, err := e.st.GetSlotCount(ctx, e.tenant)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.MutateTaskWith(ctx, &protocol.Task{ID: "holder"}, func(t *protocol.Task, _ time.Time) ([]store.Write, error) {
		t.State, t.Slot = task.StateRunning, true
		return []store.Write{store.CountWrite(c, +1)}, nil
	}); err != nil {
		t.Fatal(err)
	}
	// The first submission starts the publisher's read of the count and does not wait for it;
	// one after the read is created waiting.
	var got *protocol.Task
	submitted := 0
	for deadline := time.Now().Add(10 * time.Second); got == nil || !got.AwaitsSlot && time.Now().Before(deadline); submitted++ {
		if got, err = e.st.GetTask(ctx, e.submit(validRequest()).TaskID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !got.AwaitsSlot || got.State != task.StateQueued || got.NotBefore == nil || got.NotBefore.Sub(got.CreatedAt) != DefaultConfig().TenantWaitMax {
		t.Errorf("submitted at the cap: state %s, awaits_slot %v, not_before %v (created %v); want queued, waiting for a slot for GENBOX_TENANT_WAIT_MAX",
			got.State, got.AwaitsSlot, got.NotBefore, got.CreatedAt)
	}
	// A task of a higher priority is to go ahead of the waiting ones: the worker marks it and
	// pools it in its turn.
	urgent := validRequest()
	urgent.Priority = new(task.MaxPriority)
	v := e.submit(urgent)
	submitted++
	if got, err := e.st.GetTask(ctx, v.TaskID); err != nil {
		t.Fatal(err)
	} else if got.AwaitsSlot {
		t.Errorf("a priority-%d task was created waiting; want it left to the worker's claim", task.MaxPriority)
	}
	if n := len(e.pub.On(bus.TopicTasks)); n != submitted {
		t.Errorf("%d nudges published for %d tasks, want each task's, the waiting one's too", n, submitted)
	}
}
