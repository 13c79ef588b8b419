package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/genbox-dev/genbox/pkg/webhook"
)

// A receiver verifies a delivery with its tenant's secret before trusting the body, then dedupes
// on webhook-id.
func ExampleVerifier_Verify() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	body := []byte(`{"type":"task.succeeded","timestamp":"2026-12-02T15:00:00Z","data":{"task_id":"t1"}}`)
	sent := time.Unix(1_796_223_600, 0)

	signer, _ := webhook.NewSigner(secret)
	h := http.Header{}
	signer.SetHeaders(h, "t1.task.succeeded.0", sent, body)
	fmt.Println(h.Get(webhook.HeaderSignature))

	v, _ := webhook.NewVerifier(secret)
	v.Now = func() time.Time { return sent.Add(time.Minute) }
	fmt.Println(v.Verify(body, h))
	fmt.Println(v.Verify([]byte(`{"type":"task.failed"}`), h))
	// Output:
	// v1,360Y4j2vm3PRyXyU1lY4q+srsHUP+XoGgsH/WRFS45Q=
	// <nil>
	// webhook: no matching signature
}

// A receiver guards against replays: the first delivery of a webhook-id is acted on, a copy of it
// (a captured request sent again, or genbox's retry after a lost 2xx) is answered 2xx without
// acting again. The in-memory store holds for one process; share one across instances.
func ExampleGuard() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	body := []byte(`{"type":"task.succeeded","timestamp":"2026-12-02T15:00:00Z","data":{"task_id":"t1"}}`)
	sent := time.Unix(1_796_223_600, 0)
	signer, _ := webhook.NewSigner(secret)
	h := http.Header{}
	signer.SetHeaders(h, "t1.task.succeeded.0", sent, body)

	v, _ := webhook.NewVerifier(secret)
	v.Now = func() time.Time { return sent.Add(time.Minute) }
	guard := webhook.NewGuard(v, webhook.NewMemorySeen(10_000))
	for range 2 {
		switch err := guard.Check(context.Background(), body, h); {
		case err == nil:
			fmt.Println("act on it, answer 204")
		case errors.Is(err, webhook.ErrReplayed):
			fmt.Println("already handled, answer 204:", err)
		default:
			fmt.Println("refuse, answer 401:", err)
		}
	}
	// Output:
	// act on it, answer 204
	// already handled, answer 204: webhook: webhook-id already accepted: t1.task.succeeded.0
}
