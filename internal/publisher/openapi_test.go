package publisher

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/pkg/task"
)

// TestOpenAPIListsEveryRoute walks the route table and the served document both ways: every
// route is documented, and every documented operation is answered by a handler of its own
// (neither the no-route 404 nor a 405).
func TestOpenAPIListsEveryRoute(t *testing.T) {
	t.Parallel()
	e := setup(t)
	code, _, body := e.do("GET", "/openapi.json", "", nil, nil)
	if code != 200 {
		t.Fatalf("openapi.json: %d", code)
	}
	var doc struct {
		OpenAPI    string                               `json:"openapi"`
		Paths      map[string]map[string]map[string]any `json:"paths"`
		Webhooks   map[string]map[string]map[string]any `json:"webhooks"`
		Components struct {
			Schemas map[string]map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
	for _, rt := range e.srv.routes {
		if doc.Paths[rt.Path][strings.ToLower(rt.Method)] == nil {
			t.Errorf("route %s %s is not documented", rt.Method, rt.Path)
		}
	}
	n := 0
	for path, ops := range doc.Paths {
		for method := range ops {
			n++
			concrete := strings.NewReplacer("{id}", "some-task", "{tenant}", "acme", "{key_id}", "some-key").Replace(path)
			code, h, body := e.do(strings.ToUpper(method), concrete, testAdminKey, nil, nil)
			if code == 405 || code == 404 && strings.Contains(string(body), httpapi.TypeNoRoute) {
				t.Errorf("documented %s %s is not served: %d %s", method, path, code, body)
			}
			_ = h
		}
	}
	if n != len(e.srv.routes) {
		t.Errorf("%d documented operations, %d routes", n, len(e.srv.routes))
	}
	// The webhook payload: every event type, its headers, and the task as GET shows it.
	for _, typ := range []task.EventType{task.EventSucceeded, task.EventFailed, task.EventDead, task.EventCancelled, task.EventDiscarded} {
		post := doc.Webhooks[string(typ)]["post"]
		if post == nil {
			t.Fatalf("webhook %s missing", typ)
		}
		b, _ := json.Marshal(post)
		for _, h := range []string{"webhook-id", "webhook-timestamp", "webhook-signature", "#/components/schemas/WebhookEvent"} {
			if !strings.Contains(string(b), h) {
				t.Errorf("webhook %s does not mention %s", typ, h)
			}
		}
	}
	checkSchema(t, doc.Components.Schemas, "Task", reflect.TypeFor[task.View]())
	checkSchema(t, doc.Components.Schemas, "TaskRequest", reflect.TypeFor[task.Request]())
	checkSchema(t, doc.Components.Schemas, "WebhookEvent", reflect.TypeFor[task.Event]())
	checkSchema(t, doc.Components.Schemas, "Event", reflect.TypeFor[task.StreamEvent]())
	checkSchema(t, doc.Components.Schemas, "TaskList", reflect.TypeFor[task.List]())
	// The stream's type is any event type, not only the webhook ones its Go type would give.
	streamType, _ := doc.Components.Schemas["Event"]["properties"].(map[string]any)["type"].(map[string]any)
	if enum, _ := streamType["enum"].([]any); !slices.Contains(enum, any(string(task.EventPreview))) {
		t.Errorf("the stream's event type %v does not list %s", streamType, task.EventPreview)
	}
	if req := doc.Components.Schemas["TaskRequest"]; !slices.Equal(anyStrings(req["required"]), []string{"family", "input"}) {
		t.Errorf("TaskRequest required %v", req["required"])
	}
	for _, name := range []string{"Problem", "SubmitResponse", "BatchRequest", "BatchResponse", "TaskList", "Tenant", "APIKey"} {
		if doc.Components.Schemas[name] == nil {
			t.Errorf("schema %s missing", name)
		}
	}
}

// checkSchema compares a schema's properties with the JSON fields the Go type encodes.
func checkSchema(t *testing.T, schemas map[string]map[string]any, name string, typ reflect.Type) {
	t.Helper()
	props, _ := schemas[name]["properties"].(map[string]any)
	var got, want []string
	for p := range props {
		got = append(got, p)
	}
	for i := range typ.NumField() {
		if tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ","); tag != "-" && tag != "" {
			want = append(want, tag)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("schema %s has %v, the type encodes %v", name, got, want)
	}
}

func anyStrings(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

// FuzzDecodeTask: decoding never panics, and an accepted request re-encodes to one that decodes
// and validates to the same request.
func FuzzDecodeTask(f *testing.F) {
	for _, s := range []string{
		`{"family":"summarize","input":"x"}`,
		`{"family":"summarize","variant":"digest","input":"x","labels":{"a":"b"},"config":{"temperature":0.5,"top_k":3},"cache":true,"max_cost_usd":0.1}`,
		`{"family":"summarize","input":"x","run_before":"2999-01-01T00:00:00+02:00"}`,
		`{"family":"summarize","input":"x","callback_url":"https://example.com/h"}`,
		`{"family":"summarize","input":"x","start_after":"2030-01-02T00:00:00.123456789+02:00","run_before":"2030-01-03T00:00:00Z"}`,
		`{"family":"summarize","input":"x","delay":"1h30m"}`, `{"family":"summarize","input":"x","delay":"-1s"}`,
		`{"family":"summarize","input":"x","start_after":"2030-01-01","delay":"1s"}`,
		`{"family":1}`, `[]`, `{"input":"\ud800"}`, `{"config":{"top_k":1e10}}`, ``,
	} {
		f.Add([]byte(s))
	}
	v := validator{families: testFamilies, checkCallback: func(u string) error { return ssrf.CheckURL(u, ssrf.URLPolicy{Ports: ssrf.DefaultPorts}) }, now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req task.Request
		if err := decodeStrict(data, &req); err != nil {
			if problemFor(err).Status >= 500 {
				t.Fatalf("a decoding error maps to %d: %v", problemFor(err).Status, err)
			}
			return
		}
		normalize(&req)
		if _, err := v.validate(&req); err != nil {
			return
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var again task.Request
		if err := decodeStrict(b, &again); err != nil {
			t.Fatalf("re-decode %s: %v", b, err)
		}
		normalize(&again)
		if _, err := v.validate(&again); err != nil {
			t.Fatalf("re-validate %s: %v", b, err)
		}
		h1, _ := requestHash(&req, nil)
		h2, _ := requestHash(&again, nil)
		if h1 != h2 {
			t.Fatalf("hash changed after a round trip: %s", b)
		}
	})
}

// servedDoc is the document GET /openapi.json serves, decoded.
func servedDoc(t *testing.T, e *env) map[string]any {
	t.Helper()
	code, _, body := e.do("GET", "/openapi.json", "", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("openapi.json: %d", code)
	}
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// at walks a decoded document by keys, following a "$ref" it meets on the way; nil when a key is
// missing.
func at(doc, v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		if ref, ok := m["$ref"].(string); ok {
			m, _ = at(doc, doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...).(map[string]any)
		}
		v = m[k]
	}
	return v
}

// Generators read a request field's "default" as a promise that the field is always there:
// openapi-typescript 7 (defaultNonNullable) made cache, stream and variant required in the
// request type, so a client had to send them. A request schema says its defaults in words.
func TestOpenAPIRequestFieldsHaveNoDefault(t *testing.T) {
	t.Parallel()
	e := setup(t)
	doc := servedDoc(t, e)
	seen := map[string]bool{}
	var walk func(where string, schema any)
	walk = func(where string, schema any) {
		m, _ := schema.(map[string]any)
		if ref, ok := m["$ref"].(string); ok {
			if seen[ref] {
				return
			}
			seen[ref] = true
			where, m = ref, at(doc, doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...).(map[string]any)
		}
		if _, ok := m["default"]; ok {
			t.Errorf("request field %s has a default (%v): generated clients then require it", where, m["default"])
		}
		props, _ := m["properties"].(map[string]any)
		for name, p := range props {
			walk(where+"."+name, p)
		}
		for _, k := range []string{"items", "additionalProperties"} {
			if sub, ok := m[k].(map[string]any); ok {
				walk(where+"."+k, sub)
			}
		}
	}
	for _, rt := range e.srv.routes {
		if rt.Doc.Body != nil {
			walk(rt.Method+" "+rt.Path, at(doc, doc, "paths", rt.Path, strings.ToLower(rt.Method), "requestBody", "content", "application/json", "schema"))
		}
	}
	if len(seen) == 0 {
		t.Fatal("no request schema walked")
	}
}

// contractHeaders are the answer headers clients act on.
var contractHeaders = []string{"Location", task.HeaderReplayed, "Retry-After", "WWW-Authenticate"}

// Each header a client acts on is declared on the answers that send it: the test sends requests
// and looks each header of their answers up in the document, and every 429 and 503 the document
// lists declares Retry-After, every 401 WWW-Authenticate.
func TestOpenAPIDeclaresResponseHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	doc := servedDoc(t, e)
	_, slowKey := e.newTenant("slow", &task.Limits{SubmitRate: 0.001, SubmitBurst: 1})
	req := mustJSON(t, validRequest())
	idem := map[string]string{task.HeaderIdempotencyKey: "headers-1"}
	for _, c := range []struct {
		method, path, template, key string
		body                        []byte
		hdr                         map[string]string
		status                      int
	}{
		{"POST", "/v1/tasks", "/v1/tasks", e.key, req, idem, http.StatusAccepted},
		{"POST", "/v1/tasks", "/v1/tasks", e.key, req, idem, http.StatusOK},
		{"POST", "/v1/tasks", "/v1/tasks", slowKey, req, nil, http.StatusAccepted},
		{"POST", "/v1/tasks", "/v1/tasks", slowKey, req, nil, http.StatusTooManyRequests},
		{"GET", "/v1/tasks", "/v1/tasks", "", nil, nil, http.StatusUnauthorized},
	} {
		code, h, body := e.do(c.method, c.path, c.key, c.body, c.hdr)
		if code != c.status {
			t.Fatalf("%s %s: %d %s, want %d", c.method, c.path, code, body, c.status)
		}
		for _, name := range contractHeaders {
			if h.Get(name) == "" {
				continue
			}
			if at(doc, doc, "paths", c.template, strings.ToLower(c.method), "responses", strconv.Itoa(code), "headers", name) == nil {
				t.Errorf("%s %s answers %d with %s, which the document does not declare there", c.method, c.template, code, name)
			}
		}
	}
	for path, ops := range at(doc, doc, "paths").(map[string]any) {
		for method := range ops.(map[string]any) {
			for code, want := range map[string]string{"429": "Retry-After", "503": "Retry-After", "401": "WWW-Authenticate"} {
				if at(doc, doc, "paths", path, method, "responses", code) != nil && at(doc, doc, "paths", path, method, "responses", code, "headers", want) == nil {
					t.Errorf("%s %s: its %s does not declare %s", method, path, code, want)
				}
			}
		}
	}
}
