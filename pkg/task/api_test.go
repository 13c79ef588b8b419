package task_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/pkg/task"
)

// TestWireJSON pins the JSON of the API's shapes, field names and omissions included: clients
// outside this repository decode exactly these bytes, so a change here breaks them. Each value
// also decodes back to itself, less its fields that never travel in the body.
func TestWireJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	out := "The sum"
	view := task.View{TaskID: "t1", State: task.StateSucceeded, Family: "summarize", Variant: "default",
		Output: &out, Usage: task.Usage{PromptTokens: 10, OutputTokens: 2, TotalTokens: 12}, CostUSD: 0.5,
		Mode: task.ModeStandard, Delivery: task.DeliveryView{State: task.DeliveryDelivered, Attempts: 1}, CreatedAt: at}
	viewJSON := `{"task_id":"t1","state":"succeeded","family":"summarize","variant":"default","output":"The sum",` +
		`"usage":{"prompt_tokens":10,"output_tokens":2,"total_tokens":12},"cost_usd":0.5,"degraded":false,"stale":false,` +
		`"cache_hit":false,"replay":0,"mode":"standard","delivery":{"state":"delivered","attempts":1},"created_at":"2026-03-01T12:00:00Z"}`
	tests := []struct {
		name string
		in   any
		want string
		// back is what decoding want gives: in without its json:"-" fields.
		back any
	}{
		{
			name: "problem with field errors",
			in: &task.Problem{Type: "https://genbox.dev/problems/invalid", Title: "Bad Request", Status: 400,
				Detail: "input: must not be empty", Errors: []task.FieldError{{Field: "input", Detail: "must not be empty"}},
				RetryAfter: time.Second},
			want: `{"type":"https://genbox.dev/problems/invalid","title":"Bad Request","status":400,"detail":"input: must not be empty",` +
				`"errors":[{"field":"input","detail":"must not be empty"}]}`,
			back: &task.Problem{Type: "https://genbox.dev/problems/invalid", Title: "Bad Request", Status: 400,
				Detail: "input: must not be empty", Errors: []task.FieldError{{Field: "input", Detail: "must not be empty"}}},
		},
		{
			name: "bare problem",
			in:   &task.Problem{Type: "about:blank", Title: "Not Found", Status: 404},
			want: `{"type":"about:blank","title":"Not Found","status":404}`,
		},
		{
			name: "submit response",
			in:   &task.SubmitResponse{TaskID: "t1", State: task.StateQueued, StatusURL: "https://x/v1/tasks/t1", Replayed: true},
			want: `{"task_id":"t1","state":"queued","status_url":"https://x/v1/tasks/t1"}`,
			back: &task.SubmitResponse{TaskID: "t1", State: task.StateQueued, StatusURL: "https://x/v1/tasks/t1"},
		},
		{
			name: "batch response",
			in: &task.BatchResponse{Results: []task.BatchResult{
				{Index: 0, Status: 202, TaskID: "t1", State: task.StateQueued, StatusURL: "https://x/v1/tasks/t1"},
				{Index: 1, Status: 200, TaskID: "t2", State: task.StateRunning, StatusURL: "https://x/v1/tasks/t2", Replayed: true},
				{Index: 2, Status: 400, Problem: &task.Problem{Type: "about:blank", Title: "Bad Request", Status: 400,
					Errors: []task.FieldError{{Field: "family", Detail: "unknown"}}}},
			}},
			want: `{"results":[` +
				`{"index":0,"status":202,"task_id":"t1","state":"queued","status_url":"https://x/v1/tasks/t1"},` +
				`{"index":1,"status":200,"task_id":"t2","state":"running","status_url":"https://x/v1/tasks/t2","replayed":true},` +
				`{"index":2,"status":400,"problem":{"type":"about:blank","title":"Bad Request","status":400,"errors":[{"field":"family","detail":"unknown"}]}}]}`,
		},
		{
			name: "task list",
			in:   &task.List{Tasks: []task.View{view}, NextPageToken: "p2"},
			want: `{"tasks":[` + viewJSON + `],"next_page_token":"p2"}`,
		},
		{
			name: "stream event of a change",
			in:   &task.StreamEvent{ID: "2026-03-01T12:00:00Z", Type: task.EventSucceeded, Timestamp: at, Attempts: 1, Task: &view},
			want: `{"type":"task.succeeded","timestamp":"2026-03-01T12:00:00Z","attempts":1,"task":` + viewJSON + `}`,
			back: &task.StreamEvent{Type: task.EventSucceeded, Timestamp: at, Attempts: 1, Task: &view},
		},
		{
			name: "stream event of a preview",
			in:   &task.StreamEvent{Type: task.EventPreview, Timestamp: at, Preview: "The s"},
			want: `{"type":"task.preview","timestamp":"2026-03-01T12:00:00Z","attempts":0,"preview":"The s"}`,
		},
		{
			name: "tenant",
			in: &task.Tenant{ID: "acme", Limits: task.Limits{Concurrency: 10, SubmitRate: 2.5, SubmitBurst: 5, DailyBudgetUSD: 100},
				WebhookSecrets: []task.SecretInfo{{CreatedAt: at}, {CreatedAt: at, ExpiresAt: &at}}, CreatedAt: at, WebhookSecret: "whsec_x"},
			want: `{"id":"acme","limits":{"concurrency":10,"submit_rate":2.5,"submit_burst":5,"daily_budget_usd":100},` +
				`"webhook_secrets":[{"created_at":"2026-03-01T12:00:00Z"},{"created_at":"2026-03-01T12:00:00Z","expires_at":"2026-03-01T12:00:00Z"}],` +
				`"created_at":"2026-03-01T12:00:00Z","webhook_secret":"whsec_x"}`,
		},
		{
			name: "dead letter",
			in: &task.DeadLetter{ID: "t1:delivery:0:0", TaskID: "t1", Tenant: "acme", Family: "summarize", Variant: "default",
				Stage: task.StageDelivery, State: "open", EventID: "t1.task.succeeded.0", EventType: task.EventSucceeded, Attempts: 5,
				Usage: task.Usage{PromptTokens: 10, OutputTokens: 2, TotalTokens: 12}, CostUSD: 0.5, CreatedAt: at, UpdatedAt: at},
			want: `{"id":"t1:delivery:0:0","task_id":"t1","tenant":"acme","family":"summarize","variant":"default","stage":"delivery",` +
				`"replay":0,"round":0,"state":"open","event_id":"t1.task.succeeded.0","event_type":"task.succeeded","attempts":5,` +
				`"usage":{"prompt_tokens":10,"output_tokens":2,"total_tokens":12},"cost_usd":0.5,"applied":false,` +
				`"created_at":"2026-03-01T12:00:00Z","updated_at":"2026-03-01T12:00:00Z"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := json.Marshal(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("JSON\n got %s\nwant %s", got, tt.want)
			}
			back := tt.back
			if back == nil {
				back = tt.in
			}
			decoded := reflect.New(reflect.TypeOf(back).Elem()).Interface()
			if err := json.Unmarshal([]byte(tt.want), decoded); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(back, decoded); d != "" {
				t.Errorf("decoded (-want +got):\n%s", d)
			}
		})
	}
}

// Problem.Error is what a caller of pkg/client sees in a log line: status, title, detail and
// each refused field.
func TestProblemError(t *testing.T) {
	t.Parallel()
	p := &task.Problem{Title: "Bad Request", Status: 400, Detail: "2 fields refused",
		Errors: []task.FieldError{{Field: "input", Detail: "must not be empty"}, {Field: "Idempotency-Key", Detail: "too long"}}}
	if got, want := p.Error(), "genbox: 400 Bad Request: 2 fields refused; input: must not be empty; Idempotency-Key: too long"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := (&task.Problem{Title: "Not Found", Status: 404}).Error(), "genbox: 404 Not Found"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// A stream ends on the event whose task has finished with its delivery settled, not before.
func TestStreamEventFinal(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		state    task.State
		delivery task.DeliveryState
		want     bool
	}{
		{task.StateRunning, task.DeliveryNone, false},
		{task.StateSucceeded, task.DeliveryPending, false},
		{task.StateSucceeded, task.DeliveryDelivered, true},
		{task.StateFailed, task.DeliveryNone, true},
	} {
		ev := task.StreamEvent{Type: tt.state.Event(), Task: &task.View{State: tt.state, Delivery: task.DeliveryView{State: tt.delivery}}}
		if got := ev.Final(); got != tt.want {
			t.Errorf("%s with delivery %s: Final() = %v, want %v", tt.state, tt.delivery, got, tt.want)
		}
	}
	if (task.StreamEvent{Type: task.EventPreview, Preview: "x"}).Final() {
		t.Error("a preview is final")
	}
}

// Every state names the stream event a move into it is: its webhook event when it is an end, its
// own event otherwise — never an empty type or one the API does not list.
func TestStateStreamEvent(t *testing.T) {
	t.Parallel()
	want := map[task.State]task.EventType{
		task.StateScheduled: task.EventScheduled, task.StateQueued: task.EventQueued, task.StateRunning: task.EventRunning, task.StateWaiting: task.EventWaiting,
		task.StateSucceeded: task.EventSucceeded, task.StateFailed: task.EventFailed, task.StateDead: task.EventDead,
		task.StateCancelled: task.EventCancelled, task.StateDiscarded: task.EventDiscarded,
	}
	for _, s := range task.States {
		if got := s.StreamEvent(); got != want[s] || got == "" {
			t.Errorf("%s: stream event %q, want %q", s, got, want[s])
		}
	}
}
