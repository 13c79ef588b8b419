package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Submit a task and wait for its output. Submit retries network errors, 5xx and 429 under one
// idempotency key, so one call makes at most one task.
func ExampleClient_Submit() {
	ctx := context.Background()
	c := client.New("https://genbox.example.com", "gbx_...")
	r, err := c.Submit(ctx, task.Request{
		Family:     "summarize",
		Input:      "text to work on",
		Labels:     map[string]string{"app": "docs"},
		MaxCostUSD: new(0.05),
	})
	if err != nil {
		var p *task.Problem
		if errors.As(err, &p) {
			for _, f := range p.Errors {
				log.Printf("refused %s: %s", f.Field, f.Detail)
			}
		}
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	v, err := c.Wait(ctx, r.TaskID, 2*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	if v.State == task.StateSucceeded {
		fmt.Println(*v.Output)
	}
}

// Retrying an intent across process restarts: persist the key with the intent and submit it
// again; the same request under the same key answers the same task.
func ExampleClient_SubmitWithKey() {
	c := client.New("https://genbox.example.com", "gbx_...")
	r, err := c.SubmitWithKey(context.Background(), "invoice-2026-0042-summary", task.Request{Family: "summarize", Input: "..."})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.TaskID, r.Replayed)
}

// List every failed task, page by page.
func ExampleClient_All() {
	c := client.New("https://genbox.example.com", "gbx_...")
	for v, err := range c.All(context.Background(), client.ListOptions{State: task.StateFailed}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(v.TaskID, v.Error.Kind)
	}
}

// Set up a tenant with the admin key: its first webhook secret and an API key are shown once.
func ExampleClient_CreateTenant() {
	ctx := context.Background()
	admin := client.New("https://genbox.example.com", "the GENBOX_ADMIN_KEY")
	tn, err := admin.CreateTenant(ctx, "acme", &task.Limits{Concurrency: 10, SubmitRate: 20, SubmitBurst: 50, DailyBudgetUSD: 100})
	if err != nil {
		log.Fatal(err)
	}
	key, err := admin.CreateAPIKey(ctx, tn.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(tn.WebhookSecret, key.Key, key.KeyID)
}

// A call that meets a 503 is retried after the client's backoff, under the same Idempotency-Key,
// so the publisher makes one task of it.
func ExampleWithBackoff() {
	var keys []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if len(keys) == 1 {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"task_id":"t-1","state":"queued","status_url":"/v1/tasks/t-1"}`)
	}))
	defer hs.Close()

	c := client.New(hs.URL, "gbx_...", client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	r, err := c.Submit(context.Background(), task.Request{Family: "summarize", Input: "..."})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.TaskID, r.State)
	fmt.Println("calls:", len(keys), "same key:", keys[0] == keys[1])
	// Output:
	// t-1 queued
	// calls: 2 same key: true
}
