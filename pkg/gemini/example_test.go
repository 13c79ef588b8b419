package gemini_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// Generate retries a transient failure on the same model after a full-jitter backoff, and every
// call it made is in the Result, the failed one included.
func ExampleClient_Generate() {
	srv := geminitest.NewServer()
	defer srv.Close()
	cfg := gemini.DefaultConfig()
	cfg.BaseURL = srv.URL // the fake; a real client sets APIKey
	cfg.Models = []string{"model-a", "model-b"}
	cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	ctx := context.Background()
	c, err := gemini.New(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}

	srv.FailNext("model-a", 503)
	res, err := c.Generate(ctx, gemini.Request{TaskID: "t-1", Tenant: "acme", Prompt: "say something"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("answered by", res.Model, "degraded:", res.Degraded)
	for _, a := range res.Attempts {
		outcome := string(a.Class)
		if a.Err == nil {
			outcome = "ok"
		}
		fmt.Println("call", a.Number, a.Model, outcome)
	}
	// Output:
	// answered by model-a degraded: false
	// call 1 model-a transient
	// call 2 model-a ok
}
