package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The dead-letter calls send the dlqnotifier's admin routes — method, path, query, the admin
// key and the decision body — and decode their answers; a refused decision is its Problem.
func TestDeadLetterRoutes(t *testing.T) {
	t.Parallel()
	type seen struct{ Method, URI, Auth, Body string }
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, seen{r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), string(b)})
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/admin/dead-letters":
			fmt.Fprint(w, `{"dead_letters":[{"id":"t1:delivery:0:0","task_id":"t1","state":"open","attempts":5}]}`)
		case r.Method == http.MethodGet:
			fmt.Fprint(w, `{"id":"t1:delivery:0:0","task_id":"t1","state":"open"}`)
		case r.URL.Path == "/admin/dead-letters/t1:delivery:0:0:redeliver":
			fmt.Fprint(w, `{"id":"t1:delivery:0:0","state":"redelivered","decided_by":"admin key 0a1b2c3d"}`)
		default:
			w.Header().Set("Content-Type", task.ProblemContentType)
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"type":"https://genbox.dev/problems/conflict","title":"Conflict","status":409,"detail":"already decided"}`)
		}
	}))
	defer srv.Close()
	c := client.New(srv.URL, "admin-key-0123456789", client.WithRetries(0))
	ctx := context.Background()

	list, err := c.ListDeadLetters(ctx, "open", 5)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]task.DeadLetter{{ID: "t1:delivery:0:0", TaskID: "t1", State: "open", Attempts: 5}}, list.DeadLetters); diff != "" {
		t.Errorf("list (-want +got):\n%s", diff)
	}
	if _, err := c.ListDeadLetters(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	dl, err := c.GetDeadLetter(ctx, "t1:delivery:0:0")
	if err != nil || dl.TaskID != "t1" {
		t.Fatalf("get: %+v, %v", dl, err)
	}
	dl, err = c.DecideDeadLetter(ctx, "t1:delivery:0:0", task.DeadLetterRedeliver, "")
	if err != nil || dl.State != "redelivered" || dl.DecidedBy != "admin key 0a1b2c3d" {
		t.Fatalf("decide: %+v, %v", dl, err)
	}
	_, err = c.DecideDeadLetter(ctx, "t1:delivery:0:0", task.DeadLetterDiscard, "ops")
	var p *task.Problem
	if !errors.As(err, &p) || p.Status != http.StatusConflict || p.Detail != "already decided" {
		t.Fatalf("a refused decision: %v, want its 409 Problem", err)
	}

	const auth = "Bearer admin-key-0123456789"
	want := []seen{
		{"GET", "/admin/dead-letters?limit=5&state=open", auth, ""},
		{"GET", "/admin/dead-letters", auth, ""},
		{"GET", "/admin/dead-letters/t1:delivery:0:0", auth, ""},
		{"POST", "/admin/dead-letters/t1:delivery:0:0:redeliver", auth, `{}`},
		{"POST", "/admin/dead-letters/t1:delivery:0:0:discard", auth, `{"operator":"ops"}`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}
