package webhook

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The dev listener counts the deliveries of a bounded number of ids: one seen before the last
// listenerIDs others is forgotten (its next delivery counts as the first), so memory stays bounded
// however many deliveries a long-running listener sees.
func TestReceiverSeenIsBounded(t *testing.T) {
	t.Parallel()
	secret, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := NewVerifier(secret)
	s, _ := NewSigner(secret)
	var out bytes.Buffer
	h := Receiver(v, &out)
	body := []byte(`{"type":"task.succeeded"}`)
	deliver := func(id string) {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		s.SetHeaders(r.Header, id, time.Now(), body)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusNoContent {
			t.Fatalf("delivery %s answered %d", id, w.Code)
		}
	}
	deliver("first")
	deliver("first")
	if !strings.Contains(out.String(), "webhook-id=first type=task.succeeded timestamp=") || !strings.Contains(out.String(), " duplicate=2\n") {
		t.Fatalf("a repeated id is not flagged:\n%s", out.String())
	}
	for i := range listenerIDs {
		deliver(fmt.Sprintf("other-%d", i))
	}
	out.Reset()
	deliver("first")
	if strings.Contains(out.String(), "duplicate") {
		t.Fatalf("an id %d deliveries old is still counted: %s", listenerIDs, out.String())
	}
}

func TestLRU(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLRU[int](2)
	l.put("a", 1, time.Time{})
	l.put("b", 2, at)
	if v, ok := l.get("a", at); !ok || v != 1 {
		t.Fatalf("a = %d, %v", v, ok)
	}
	if _, ok := l.get("b", at.Add(time.Second)); ok {
		t.Fatal("b is found past its validity")
	}
	l.put("a", 3, time.Time{}) // a is the most recent now: c evicts b
	l.put("c", 4, time.Time{})
	if _, ok := l.get("b", at); ok || l.len() != 2 {
		t.Fatalf("b kept (len %d): the least recent entry must go first", l.len())
	}
	if v, _ := l.get("a", at); v != 3 {
		t.Fatalf("a = %d, want 3", v)
	}
	l.remove("a")
	if _, ok := l.get("a", at); ok || l.len() != 1 {
		t.Fatal("a still there after remove")
	}
}
