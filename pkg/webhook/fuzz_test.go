package webhook_test

import (
	"net/http"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/genbox-dev/genbox/pkg/webhook"
)

// FuzzVerify feeds arbitrary header values to the verifier: it must never panic, and it must
// agree with the official library on whether a delivery verifies.
func FuzzVerify(f *testing.F) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	now := time.Unix(1_796_223_600, 0)
	signer, err := webhook.NewSigner(secret)
	if err != nil {
		f.Fatal(err)
	}
	good := signer.Signature("id", now, []byte("{}"))
	f.Add("id", "1796223600", good, []byte("{}"))
	f.Add("id", "1796223600", "v1,abc v2,def "+good, []byte("{}"))
	f.Add("id", "-1", ",,, v1, v1,=", []byte(""))
	f.Add("", "", "", []byte(nil))
	f.Add("id", "99999999999999999999", "v1,"+good[3:], []byte("{}"))
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		f.Fatal(err)
	}
	v.Now = func() time.Time { return now }
	theirs, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set(webhook.HeaderID, id)
		h.Set(webhook.HeaderTimestamp, ts)
		h.Set(webhook.HeaderSignature, sig)
		ours := v.Verify(body, h)
		if ours != nil {
			return
		}
		// Ours accepted: the official library (which ignores our injected clock, so skip its
		// timestamp check) must accept it too.
		if err := theirs.VerifyIgnoringTimestamp(body, h); err != nil {
			t.Fatalf("we accept what the official library refuses (%v): id=%q ts=%q sig=%q", err, id, ts, sig)
		}
	})
}
