package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Delay a task: it is scheduled, and starts no sooner than 90 s after the submission (or give
// StartAfter, an absolute time). Cancel it before then and it bills nothing.
func ExampleClient_Submit_delayed() {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req task.Request
		_ = json.NewDecoder(r.Body).Decode(&req)
		fmt.Println("delay sent:", req.Delay)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"task_id":"t-1","state":"scheduled","status_url":"/v1/tasks/t-1"}`)
	}))
	defer hs.Close()

	c := client.New(hs.URL, "gbx_...")
	r, err := c.Submit(context.Background(), task.Request{Family: "summarize", Input: "...", Delay: "90s"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.TaskID, r.State)
	// Output:
	// delay sent: 90s
	// t-1 scheduled
}
