package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

func TestPushRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		method string
		body   string
		want   int
	}{
		{"GET", http.MethodGet, "", http.StatusMethodNotAllowed},
		{"malformed JSON", http.MethodPost, `{"message":`, http.StatusBadRequest},
		{"not an object", http.MethodPost, `[1,2]`, http.StatusBadRequest},
		{"empty body", http.MethodPost, ``, http.StatusBadRequest},
		{"unknown field", http.MethodPost, `{"message":{"messageId":"1"},"subscription":"s","extra":1}`, http.StatusBadRequest},
		{"unknown message field", http.MethodPost, `{"message":{"messageId":"1","dataz":"eA=="},"subscription":"s"}`, http.StatusBadRequest},
		{"data not a string", http.MethodPost, `{"message":{"messageId":"1","data":5},"subscription":"s"}`, http.StatusBadRequest},
		{"attributes not strings", http.MethodPost, `{"message":{"messageId":"1","attributes":{"a":1}},"subscription":"s"}`, http.StatusBadRequest},
		{"deliveryAttempt a string", http.MethodPost, `{"message":{"messageId":"1"},"deliveryAttempt":"2"}`, http.StatusBadRequest},
		{"bad publish time", http.MethodPost, `{"message":{"messageId":"1","publishTime":"yesterday"}}`, http.StatusBadRequest},
		{"bad base64", http.MethodPost, `{"message":{"messageId":"1","data":"!!not base64!!"},"subscription":"s"}`, http.StatusBadRequest},
		{"no message", http.MethodPost, `{"subscription":"s"}`, http.StatusBadRequest},
		{"no message id", http.MethodPost, `{"message":{"data":"eA=="},"subscription":"s"}`, http.StatusBadRequest},
		{"trailing data", http.MethodPost, `{"message":{"messageId":"1"}}{}`, http.StatusBadRequest},
		{"oversized", http.MethodPost, `{"message":{"messageId":"1","data":"` + strings.Repeat("A", MaxPushBytes) + `"}}`, http.StatusRequestEntityTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			h := Push(HandlerFunc(func(context.Context, *Message) Result {
				calls.Add(1)
				return Ack
			}), slog.New(slog.DiscardHandler))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, "/push", strings.NewReader(tt.body)))
			if rec.Code != tt.want {
				t.Errorf("status %d, want %d (body %s)", rec.Code, tt.want, rec.Body)
			}
			if calls.Load() != 0 {
				t.Errorf("handler called %d times for a bad request", calls.Load())
			}
			if rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Errorf("content type %q, want a problem document", rec.Header().Get("Content-Type"))
			}
		})
	}
}

func TestPushResults(t *testing.T) {
	t.Parallel()
	body := `{"message":{"data":"aGVsbG8=","attributes":{"task_id":"t1"},"messageId":"42","message_id":"42",` +
		`"publishTime":"2026-12-02T14:00:00.123Z","publish_time":"2026-12-02T14:00:00.123Z"},` +
		`"subscription":"projects/p/subscriptions/s","deliveryAttempt":3}`
	for _, tt := range []struct {
		res  Result
		want int
	}{{Ack, http.StatusNoContent}, {Nack, http.StatusServiceUnavailable}} {
		t.Run(tt.res.String(), func(t *testing.T) {
			t.Parallel()
			var got *Message
			h := Push(HandlerFunc(func(_ context.Context, m *Message) Result {
				got = m
				return tt.res
			}), slog.New(slog.DiscardHandler))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/push", strings.NewReader(body)))
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d", rec.Code, tt.want)
			}
			want := &Message{ID: "42", Data: []byte("hello"), Attributes: map[string]string{"task_id": "t1"},
				DeliveryAttempt: 3, PublishTime: time.Date(2026, 12, 2, 14, 0, 0, 123e6, time.UTC)}
			if !sameMessage(got, want) {
				t.Errorf("handler got %+v, want %+v", got, want)
			}
		})
	}
}

func sameMessage(a, b *Message) bool {
	return a != nil && b != nil && a.ID == b.ID && bytes.Equal(a.Data, b.Data) && maps.Equal(a.Attributes, b.Attributes) &&
		a.DeliveryAttempt == b.DeliveryAttempt && a.PublishTime.Equal(b.PublishTime)
}

// FuzzPushEnvelope checks that the decoder never panics on any body, and that an envelope
// built from the fuzzed values decodes to the same message.
func FuzzPushEnvelope(f *testing.F) {
	f.Add([]byte(`{"message":{"data":"aGVsbG8=","messageId":"1"},"subscription":"s"}`), []byte("hello"), "task_id", "t1", "1", 1)
	f.Add([]byte(`{"message":{"message_id":"1","publish_time":"2026-01-01T00:00:00Z"}}`), []byte{}, "", "", "x", 0)
	f.Add([]byte(`{"message":null}`), []byte{0, 255}, "k", "v", "id", 100)
	f.Fuzz(func(t *testing.T, body, data []byte, key, value, id string, attempt int) {
		_, _, _ = decodePush(bytes.NewReader(body))

		if id == "" || !utf8.ValidString(id+key+value) {
			return // encoding/json replaces invalid UTF-8, so such strings cannot round-trip
		}
		pm := &pushMessage{Data: data, Attributes: map[string]string{key: value}, MessageID: id}
		at := time.Unix(1_700_000_000, int64(attempt)&0xfffffff).UTC()
		pm.PublishTime = &at
		env := pushEnvelope{Message: pm, Subscription: "projects/p/subscriptions/s", DeliveryAttempt: &attempt}
		b, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		got, sub, err := decodePush(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("valid envelope %s rejected: %v", b, err)
		}
		want := &Message{ID: id, Data: data, Attributes: map[string]string{key: value}, DeliveryAttempt: attempt, PublishTime: at}
		if sub != env.Subscription || !sameMessage(got, want) {
			t.Errorf("round trip of %s: got %+v sub %q, want %+v", b, got, sub, want)
		}
	})
}
