package publisher

import (
	"cmp"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// schemaNames names the component schema of each wire type; the others are named after their Go type.
var schemaNames = map[reflect.Type]string{
	reflect.TypeFor[task.Request]():      "TaskRequest",
	reflect.TypeFor[task.View]():         "Task",
	reflect.TypeFor[task.Event]():        "WebhookEvent",
	reflect.TypeFor[task.GenConfig]():    "GenConfig",
	reflect.TypeFor[task.Usage]():        "Usage",
	reflect.TypeFor[task.ErrorView]():    "TaskError",
	reflect.TypeFor[task.DeliveryView](): "Delivery",
	reflect.TypeFor[task.List]():         "TaskList",
	reflect.TypeFor[task.StreamEvent]():  "Event",
	reflect.TypeFor[task.File]():         "File",
	reflect.TypeFor[task.FileView]():     "TaskFile",
	reflect.TypeFor[task.Upload]():       "Upload",
}

// webhookEvents are the event types a webhook carries; the event stream sends them and
// streamEvents.
var (
	webhookEvents = []task.EventType{task.EventSucceeded, task.EventFailed, task.EventDead, task.EventCancelled, task.EventDiscarded}
	streamEvents  = []task.EventType{task.EventScheduled, task.EventQueued, task.EventRunning, task.EventWaiting, task.EventAttempt, task.EventDelivery, task.EventUpdated, task.EventPreview}
)

// enums lists the values of the string types that have a fixed set.
var enums = map[reflect.Type][]string{
	reflect.TypeFor[task.State]():         strs(task.States),
	reflect.TypeFor[task.DeliveryState](): {"none", "pending", "delivered", "dead", "discarded"},
	reflect.TypeFor[task.EventType]():     strs(webhookEvents),
	reflect.TypeFor[task.ErrorKind]():     {"permanent", "transient", "network", "quality", "expired", "budget", "crash"},
	reflect.TypeFor[task.Mode]():          strs(task.Modes),
}

func strs[T ~string](in []T) []string {
	out := make([]string, len(in))
	for i, v := range in {
		out[i] = string(v)
	}
	return out
}

// schemas builds JSON Schemas (2020-12, as OpenAPI 3.1 uses) from Go wire types and their json
// tags, so the document cannot drift from what the server encodes.
type schemas map[string]any

func (c schemas) of(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[time.Time]() {
		return map[string]any{"type": "string", "format": "date-time"}
	}
	if e, ok := enums[t]; ok {
		return map[string]any{"type": "string", "enum": e}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": c.of(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": c.of(t.Elem())}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		name, ok := schemaNames[t]
		if !ok {
			name = t.Name()
		}
		ref := map[string]any{"$ref": "#/components/schemas/" + name}
		if _, done := c[name]; done {
			return ref
		}
		c[name] = nil // placeholder against recursion
		props := map[string]any{}
		var required []string
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if !f.IsExported() || tag == "-" {
				continue
			}
			fname, opts, _ := strings.Cut(tag, ",")
			if fname == "" {
				fname = f.Name
			}
			props[fname] = c.of(f.Type)
			if !strings.Contains(opts, "omitempty") && f.Type.Kind() != reflect.Pointer {
				required = append(required, fname)
			}
		}
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			s["required"] = required
		}
		c[name] = s
		return ref
	}
	return map[string]any{}
}

// fieldRanges adds the documented bounds of request fields to their schemas.
func fieldRanges(c schemas) {
	set := func(schema, field string, kv ...any) {
		s, _ := c[schema].(map[string]any)
		props, _ := s["properties"].(map[string]any)
		p, _ := props[field].(map[string]any)
		for i := 0; p != nil && i+1 < len(kv); i += 2 {
			p[kv[i].(string)] = kv[i+1]
		}
	}
	set("GenConfig", "temperature", "minimum", 0, "maximum", 2)
	set("GenConfig", "top_p", "minimum", 0, "maximum", 1)
	set("GenConfig", "top_k", "minimum", 1, "maximum", maxTopK)
	set("GenConfig", "max_output_tokens", "minimum", 1, "maximum", maxMaxOutputTokens)
	set("TaskRequest", "input", "maxLength", MaxInputBytes, "minLength", 1, "description", "At most 256 KiB of UTF-8.")
	set("TaskRequest", "family", "description", "A known prompt family.")
	// No "default" on request fields: generators (openapi-typescript's defaultNonNullable) then
	// make the field required. The default is said in words.
	set("TaskRequest", "variant", "description", "A variant of the family; absent: "+strconv.Quote(prompts.DefaultVariant)+".")
	set("TaskRequest", "callback_url", "format", "uri", "description", "https; private, loopback, link-local and metadata addresses are refused.")
	set("TaskRequest", "labels", "maxProperties", MaxLabels)
	set("TaskRequest", "cache", "description", "Reuse an identical earlier output of this tenant; absent: false.")
	set("TaskRequest", "run_before", "format", "date-time", "description", "RFC 3339, in the future: not worth generating after this.")
	set("TaskRequest", "start_after", "format", "date-time", "description", "RFC 3339, in the future, at most 30 days ahead and before run_before: the task is scheduled, and starts no sooner than this (within the sweeper's bound, docs/liveness.md). Not with delay.")
	set("TaskRequest", "delay", "pattern", delayPattern, "description", `A Go duration such as "90s" or "1h30m", at most 720h: start_after, counted from the submission. "0s" is no delay. Not with start_after.`)
	set("Task", "start_after", "description", "When a delayed task starts at the earliest; it is scheduled until then.")
	set("TaskRequest", "max_cost_usd", "exclusiveMinimum", 0)
	set("TaskRequest", "priority", "minimum", task.MinPriority, "maximum", task.MaxPriority,
		"description", "Among the tenant's tasks waiting for a slot of its concurrency, higher first (then oldest first); absent: "+strconv.Itoa(task.DefaultPriority)+".")
	set("BatchRequest", "tasks", "minItems", 1, "maxItems", task.MaxBatch)
	set("TaskRequest", "mode", "description", "standard (at once), flex (the Flex tier: about half the price, minutes), batch (the Batch API: about half the price, within 24 h or run_before) or priority (the Priority tier: served first under load, at a premium); default the family's mode.")
	set("Task", "tier", "description", "The service tier that served the output's call (standard, flex, batch or priority): Gemini may serve a priority task on the standard tier, and it is charged for the tier that served it.")
	set("Task", "batch_job", "description", "The batch job (batch_jobs id) the task runs or ran in.")
	set("TaskRequest", "stream", "description", "Stream the generation: GET /v1/tasks/{id}/events sends task.preview events with the text so far. Previews are never the stored output and never reach the webhook. Absent: false.")
	set("Event", "type", "enum", strs(slices.Concat(webhookEvents, streamEvents)), "description", "The SSE event name: a webhook event type for a move into an end state, task.scheduled, task.queued, task.running, task.waiting, task.attempt, task.delivery, task.updated or task.preview. The SSE id is the task document's update time (none on a preview).")
	set("Limits", "weight", "minimum", 0, "description", "The tenant's part of the worker pool's slots when tenants together want more than it holds: each gets slots in proportion to its weight, up to its concurrency; absent or 0: 1.")
	set("Limits", "rpm", "minimum", 0, "description", "Model calls a minute, across every worker instance; absent or 0: no limit. A task over it waits, queued, with no attempt counted.")
	set("Limits", "tpm", "minimum", 0, "description", "Model tokens (prompt plus output) a minute, across every worker instance, each call counted at its worst case until it answers; for batch-mode tasks, the tokens their requests hold in batch jobs not yet done, each at its worst case; absent or 0: no limit.")
	set("Usage", "cached_tokens", "description", "The part of prompt_tokens a context cache served (explicit or implicit), billed at the cached rate.")
	for _, typ := range []string{"ScheduleRequest", "SchedulePatch", "Schedule"} {
		set(typ, "cron", "description", "Five cron fields (minute hour day-of-month month day-of-week) or a descriptor such as @daily; @every is refused.")
		set(typ, "time_zone", "description", "An IANA time zone name, e.g. Asia/Tokyo; fires follow its wall clock (RFC 5545 for skipped and repeated times).")
		set(typ, "overlap", "enum", []string{task.OverlapSkip, task.OverlapQueue})
		set(typ, "catch_up", "enum", []string{task.CatchUpNone, task.CatchUpLast, task.CatchUpAll})
	}
	set("ScheduleRequest", "overlap", "description", "skip: a fire while the previous fire's task has not finished is skipped; queue: every fire is submitted. Absent: skip.")
	set("ScheduleRequest", "catch_up", "description", "Fires missed while genbox was down: none, last (only the latest) or all (each, up to the latest 100). Absent: last.")
	set("ScheduleRequest", "task", "description", "A task request as POST /v1/tasks takes it, without run_before; {{fire_time}} and {{fire_date}} in subject_key, input and label values are replaced by each fire's time in the zone.")
}

// openAPI builds the document from the route table.
func (s *Server) openAPI() map[string]any {
	c := schemas{}
	problemRef := c.of(reflect.TypeFor[task.Problem]())
	paths := map[string]any{}
	for _, rt := range s.routes {
		op := map[string]any{"summary": rt.Summary, "operationId": operationID(rt)}
		switch rt.Auth {
		case authTenant:
			op["security"] = []any{map[string]any{"apiKey": []string{}}}
		case authAdmin:
			op["security"] = []any{map[string]any{"adminKey": []string{}}}
		}
		var params []any
		for _, seg := range strings.Split(rt.Path, "/") {
			if i, j := strings.IndexByte(seg, '{'), strings.IndexByte(seg, '}'); i >= 0 && j > i {
				params = append(params, map[string]any{"name": seg[i+1 : j], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
			}
		}
		for _, p := range rt.Doc.Query {
			params = append(params, map[string]any{"name": p.Name, "in": "query", "required": p.Required, "description": p.Desc, "schema": map[string]any{"type": p.Type}})
		}
		for _, p := range rt.Doc.Header {
			params = append(params, map[string]any{"name": p.Name, "in": "header", "required": p.Required, "description": p.Desc, "schema": map[string]any{"type": p.Type}})
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		if rt.Doc.Body != nil {
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				"application/json": map[string]any{"schema": c.of(reflect.TypeOf(rt.Doc.Body))}}}
		}
		ct := cmp.Or(rt.Doc.ContentType, "application/json")
		responses := map[string]any{}
		for _, a := range append([]answer{{Status: rt.Doc.OK, Desc: http.StatusText(rt.Doc.OK), Result: rt.Doc.Result, Headers: rt.Doc.OKHeaders}}, rt.Doc.Also...) {
			resp := map[string]any{"description": a.Desc}
			if a.Result != nil {
				resp["content"] = map[string]any{ct: map[string]any{"schema": c.of(reflect.TypeOf(a.Result))}}
			}
			withHeaders(resp, a.Headers...)
			responses[strconv.Itoa(a.Status)] = resp
		}
		errs := slices.Clone(rt.Doc.Errors)
		if rt.Auth != authNone {
			errs = append(errs, 503) // every authenticated route waits on the store
		}
		for _, code := range append(errs, 500) {
			resp := map[string]any{"description": http.StatusText(code),
				"content": map[string]any{task.ProblemContentType: map[string]any{"schema": problemRef}}}
			withHeaders(resp, errorHeaders[code]...)
			responses[strconv.Itoa(code)] = resp
		}
		op["responses"] = responses
		item, _ := paths[rt.Path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.Path] = item
		}
		item[strings.ToLower(rt.Method)] = op
	}
	eventRef := c.of(reflect.TypeFor[task.Event]())
	hdr := func(name, desc string) map[string]any {
		return map[string]any{"name": name, "in": "header", "required": true, "description": desc, "schema": map[string]any{"type": "string"}}
	}
	webhooks := map[string]any{}
	for _, typ := range enums[reflect.TypeFor[task.EventType]()] {
		webhooks[typ] = map[string]any{"post": map[string]any{
			"summary":     "Sent to the task's callback_url when the task moves into its end state (Standard Webhooks).",
			"operationId": "webhook_" + strings.ReplaceAll(typ, ".", "_"),
			"parameters": []any{
				hdr("webhook-id", "{task_id}.{type}.{replay}: the same across retries and Redeliver, new after Regenerate."),
				hdr("webhook-timestamp", "Unix seconds."),
				hdr("webhook-signature", "Space-separated v1,<base64 HMAC-SHA256 of id.timestamp.body>, one per active whsec_ secret of the tenant."),
			},
			"requestBody": map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": eventRef}}},
			"responses": map[string]any{
				"2XX":     map[string]any{"description": "Delivered."},
				"default": map[string]any{"description": "408, 429 and 5xx are retried with backoff; another 4xx is final (the delivery goes to the dead-letter queue)."},
			},
		}}
	}
	fieldRanges(c)
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{"title": "genbox", "version": "1.0.0",
			"description": "Runs Gemini generation tasks asynchronously: submit, then poll or receive a signed webhook. Errors are RFC 9457 problem details."},
		"paths":    paths,
		"webhooks": webhooks,
		"components": map[string]any{
			"schemas": map[string]any(c),
			"headers": answerHeaders,
			"securitySchemes": map[string]any{
				"apiKey":   map[string]any{"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
				"adminKey": map[string]any{"type": "http", "scheme": "bearer", "description": "GENBOX_ADMIN_KEY."},
			},
		},
	}
}

// answerHeaders are the answer headers clients act on, as components of the document.
var answerHeaders = map[string]any{
	"Location": map[string]any{"description": "The task's status_url.",
		"schema": map[string]any{"type": "string", "format": "uri"}},
	task.HeaderReplayed: map[string]any{"description": "true: an earlier request with the same Idempotency-Key created this task.",
		"schema": map[string]any{"type": "string", "enum": []string{"true"}}},
	"Retry-After": map[string]any{"description": "Seconds to wait before retrying.",
		"schema": map[string]any{"type": "integer", "minimum": 1}},
	"WWW-Authenticate": map[string]any{"description": `The scheme to authenticate with: Bearer realm="genbox".`,
		"schema": map[string]any{"type": "string"}},
}

// errorHeaders are the answer headers of an error status, wherever it is answered.
var errorHeaders = map[int][]string{
	http.StatusUnauthorized:       {"WWW-Authenticate"},
	http.StatusTooManyRequests:    {"Retry-After"},
	http.StatusServiceUnavailable: {"Retry-After"},
}

// withHeaders declares names (of answerHeaders) on a response object.
func withHeaders(resp map[string]any, names ...string) {
	if len(names) == 0 {
		return
	}
	h := map[string]any{}
	for _, n := range names {
		if answerHeaders[n] == nil {
			panic("publisher: no answer header " + n)
		}
		h[n] = map[string]any{"$ref": "#/components/headers/" + n}
	}
	resp["headers"] = h
}

func operationID(rt route) string {
	r := strings.NewReplacer("/", "_", "{", "", "}", "", ":", "_", ".", "_", "-", "_")
	return strings.ToLower(rt.Method) + strings.TrimRight(r.Replace(rt.Path), "_")
}

// openAPIJSON renders the document once per server.
func (s *Server) openAPIJSON() []byte {
	b, err := json.MarshalIndent(s.openAPI(), "", "  ")
	if err != nil {
		panic("publisher: marshal OpenAPI document: " + err.Error()) // maps of plain values always marshal
	}
	return b
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, _ *http.Request, _ string) error {
	w.Header().Set("Content-Type", "application/json")
	_, err := w.Write(s.doc())
	return err
}
