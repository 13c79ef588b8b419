package publisher

import (
	"github.com/genbox-dev/genbox/pkg/task"
)

// opDoc documents a route for the OpenAPI document.
type opDoc struct {
	Body   any // a value of the request body's type; nil: no body
	OK     int
	Result any // a value of the answer's type; nil: no body
	// ContentType is the answer's media type when it is not application/json.
	ContentType string
	// OKHeaders are the answer headers the OK answer carries (names of answerHeaders).
	OKHeaders []string
	// Also are the route's other successful answers.
	Also []answer
	// Query and Header are the request's parameters.
	Query  []param
	Header []param
	Errors []int
}

// answer is a successful answer besides a route's OK one.
type answer struct {
	Status int
	Desc   string
	Result any // nil: no body
	// Headers are the answer headers it carries (names of answerHeaders).
	Headers []string
}

// param is a query or header parameter.
type param struct {
	Name, Desc, Type string
	Required         bool
}

var idemHeader = param{Name: task.HeaderIdempotencyKey, Type: "string",
	Desc: "Names the intent: the same key and body return the same task (200, Idempotent-Replayed: true); a different body is a 422. Remembered as long as the task is retained."}

var rerunIdemHeader = param{Name: task.HeaderIdempotencyKey, Type: "string",
	Desc: "Names the re-run when the body has no rerun_id: the same key and filter return the same re-run (200, Idempotent-Replayed: true); another filter is a 422."}

// routeTable lists every route the server answers.
func (s *Server) routeTable() []route {
	tenantErrs := []int{400, 401, 404, 503}
	return []route{
		{Method: "GET", Path: "/openapi.json", Summary: "This OpenAPI document", Auth: authNone, Handle: s.handleOpenAPI,
			Doc: opDoc{OK: 200, Result: map[string]any{}}},
		{Method: "POST", Path: "/v1/tasks", Summary: "Submit a task", Auth: authTenant, Handle: s.handleSubmit,
			Doc: opDoc{Body: task.Request{}, OK: 202, Result: task.SubmitResponse{}, OKHeaders: []string{"Location"}, Header: []param{idemHeader},
				Also: []answer{{Status: 200, Desc: "The task an earlier request with the same Idempotency-Key created",
					Result: task.SubmitResponse{}, Headers: []string{"Location", task.HeaderReplayed}}},
				Errors: []int{400, 401, 403, 413, 415, 422, 429, 503}}},
		{Method: "POST", Path: "/v1/tasks:batch", Summary: "Submit up to 100 tasks; each is accepted or refused on its own", Auth: authTenant, Handle: s.handleBatch,
			Doc: opDoc{Body: task.BatchRequest{}, OK: 200, Result: task.BatchResponse{}, Header: []param{idemHeader},
				Errors: []int{400, 401, 413, 415}}},
		{Method: "POST", Path: "/v1/tasks:rerun", Summary: "Re-run the tenant's finished tasks a filter matches (each a new replay under the current prompt version, paced within the tenant's cap and budget), or with dry_run count them and estimate the cost", Auth: authTenant, Handle: s.handleRerun,
			Doc: opDoc{Body: task.RerunRequest{}, OK: 201, Result: task.Rerun{}, OKHeaders: []string{"Location"}, Header: []param{rerunIdemHeader},
				Also: []answer{
					{Status: 200, Desc: "A dry run's count and estimate; or the re-run an earlier request of the same rerun_id (or Idempotency-Key) created", Result: task.Rerun{}, Headers: []string{task.HeaderReplayed}},
				},
				Errors: []int{400, 401, 413, 415, 422, 429, 503}}},
		{Method: "GET", Path: "/v1/reruns/{rerun}", Summary: "Read a re-run and its progress", Auth: authTenant, Handle: s.handleGetRerun,
			Doc: opDoc{OK: 200, Result: task.Rerun{}, Errors: tenantErrs}},
		{Method: "GET", Path: "/v1/tasks", Summary: "List the tenant's tasks, newest first", Auth: authTenant, Handle: s.handleList,
			Doc: opDoc{OK: 200, Result: task.List{}, Errors: tenantErrs, Query: []param{
				{Name: "state", Type: "string", Desc: "Only tasks in this state."},
				{Name: "limit", Type: "integer", Desc: "Page size, 1 to 100 (default 20)."},
				{Name: "page_token", Type: "string", Desc: "next_page_token of the previous page."},
			}}},
		{Method: "GET", Path: "/v1/tasks/{id}", Summary: "Read a task", Auth: authTenant, Handle: s.handleGet,
			Doc: opDoc{OK: 200, Result: task.View{}, Errors: tenantErrs}},
		{Method: "GET", Path: "/v1/tasks/{id}/events", Summary: "Follow a task as Server-Sent Events: its state at once, then each change, until it has finished and its delivery is settled; a streamed task's previews too", Auth: authTenant, Handle: s.handleEvents,
			Doc: opDoc{OK: 200, Result: task.StreamEvent{}, ContentType: "text/event-stream", Errors: append(tenantErrs, 429), Header: []param{
				{Name: "Last-Event-ID", Type: "string", Desc: "The id of the last event received: the stream resumes after it (EventSource sends it on reconnect)."},
			}, Also: []answer{{Status: 204, Desc: "The task has ended and Last-Event-ID is its final event's id (or later): nothing to send, and an EventSource stops reconnecting"}}}},
		{Method: "POST", Path: "/v1/tasks/{id}:cancel", Summary: "Cancel a queued or waiting task (queues task.cancelled)", Auth: authTenant, Handle: s.handleCancel,
			Doc: opDoc{OK: 200, Result: task.View{}, Errors: append(tenantErrs, 409)}},
		{Method: "DELETE", Path: "/v1/tasks/{id}", Summary: "Erase a finished task's input and outputs, its uploads and Files API copies, preview, cache entry and last good output, discarding its dead webhook delivery; the accounting stays", Auth: authTenant, Handle: s.handleDelete,
			Doc: opDoc{OK: 204, Errors: append(tenantErrs, 409)}},
		{Method: "POST", Path: "/v1/schedules", Summary: "Create a recurring schedule: a cron expression in a time zone and the task each fire submits", Auth: authTenant, Handle: s.handleCreateSchedule,
			Doc: opDoc{Body: task.ScheduleRequest{}, OK: 201, Result: task.Schedule{}, OKHeaders: []string{"Location"}, Header: []param{idemHeader},
				Also: []answer{{Status: 200, Desc: "The schedule an earlier request with the same Idempotency-Key created",
					Result: task.Schedule{}, Headers: []string{"Location", task.HeaderReplayed}}},
				Errors: []int{400, 401, 413, 415, 422, 503}}},
		{Method: "GET", Path: "/v1/schedules", Summary: "List the tenant's schedules", Auth: authTenant, Handle: s.handleListSchedules,
			Doc: opDoc{OK: 200, Result: task.ScheduleList{}, Errors: tenantErrs, Query: []param{
				{Name: "limit", Type: "integer", Desc: "Page size, 1 to 100 (default 100)."},
				{Name: "page_token", Type: "string", Desc: "next_page_token of the previous page."},
			}}},
		{Method: "GET", Path: "/v1/schedules/{id}", Summary: "Read a schedule", Auth: authTenant, Handle: s.handleGetSchedule,
			Doc: opDoc{OK: 200, Result: task.Schedule{}, Errors: tenantErrs}},
		{Method: "PATCH", Path: "/v1/schedules/{id}", Summary: "Change a schedule: each field present replaces the schedule's (paused pauses and resumes it)", Auth: authTenant, Handle: s.handlePatchSchedule,
			Doc: opDoc{Body: task.SchedulePatch{}, OK: 200, Result: task.Schedule{}, Errors: append(tenantErrs, 413, 415)}},
		{Method: "DELETE", Path: "/v1/schedules/{id}", Summary: "Delete a schedule: it fires no more; the tasks it fired stay", Auth: authTenant, Handle: s.handleDeleteSchedule,
			Doc: opDoc{OK: 204, Errors: tenantErrs}},
		{Method: "POST", Path: "/v1/uploads", Summary: "Get a signed URL to upload one file (PUT it with the headers given, before expires_at), then name it in a task's files by upload_id", Auth: authTenant, Handle: s.handleUpload,
			Doc: opDoc{Body: task.UploadRequest{}, OK: 201, Result: task.Upload{}, Errors: []int{400, 401, 413, 415, 429, 501, 503}}},
		{Method: "POST", Path: "/admin/v1/tenants", Summary: "Create a tenant; the answer carries its first webhook secret, shown once", Auth: authAdmin, Handle: s.handleCreateTenant,
			Doc: opDoc{Body: task.CreateTenantRequest{}, OK: 201, Result: task.Tenant{}, Errors: []int{400, 401, 403, 409, 413}}},
		{Method: "GET", Path: "/admin/v1/tenants/{tenant}", Summary: "Read a tenant (without its secrets)", Auth: authAdmin, Handle: s.handleGetTenant,
			Doc: opDoc{OK: 200, Result: task.Tenant{}, Errors: []int{401, 403, 404}}},
		{Method: "PUT", Path: "/admin/v1/tenants/{tenant}/limits", Summary: "Replace a tenant's limits", Auth: authAdmin, Handle: s.handleSetLimits,
			Doc: opDoc{Body: task.Limits{}, OK: 200, Result: task.Tenant{}, Errors: []int{400, 401, 403, 404}}},
		{Method: "POST", Path: "/admin/v1/tenants/{tenant}/keys", Summary: "Create an API key; the key is shown once", Auth: authAdmin, Handle: s.handleCreateKey,
			Doc: opDoc{OK: 201, Result: task.APIKey{}, Errors: []int{401, 403, 404}}},
		{Method: "DELETE", Path: "/admin/v1/keys/{key_id}", Summary: "Revoke an API key; it fails at once", Auth: authAdmin, Handle: s.handleRevokeKey,
			Doc: opDoc{OK: 200, Result: task.APIKey{}, Errors: []int{401, 403, 404}}},
		{Method: "POST", Path: "/admin/v1/tenants/{tenant}/webhook-secrets:rotate", Summary: "Rotate the webhook secret; earlier ones keep signing for the overlap", Auth: authAdmin, Handle: s.handleRotateSecret,
			Doc: opDoc{OK: 200, Result: task.RotatedSecret{}, Errors: []int{401, 403, 404}}},
	}
}
