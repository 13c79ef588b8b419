package geminitest_test

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// A test scripts two overloads, then reads what the invoice would show for a task.
func Example() {
	ctx := context.Background()
	srv := geminitest.NewServer()
	defer srv.Close()
	client, err := genai.NewClient(ctx, srv.ClientConfig())
	if err != nil {
		panic(err)
	}
	srv.FailNext("gemini-2.5-flash", 503, 503)
	for range 3 {
		_, err := client.Models.GenerateContent(ctx, "gemini-2.5-flash", genai.Text("summarize task t-42"), nil)
		var apiErr genai.APIError
		if errors.As(err, &apiErr) {
			fmt.Println(apiErr.Code, apiErr.Status)
			continue
		}
		fmt.Println("ok", err)
	}
	l := srv.Ledger()
	fmt.Printf("calls %d, failed %d, task t-42 billed %d time(s)\n", l.Total.Calls, l.Total.Failed, len(l.BillsFor("t-42")))
	// Output:
	// 503 UNAVAILABLE
	// 503 UNAVAILABLE
	// ok <nil>
	// calls 3, failed 2, task t-42 billed 1 time(s)
}
