package webhook_test

import (
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
