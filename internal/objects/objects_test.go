package objects_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/api/option"

	"github.com/genbox-dev/genbox/internal/objects"
)

// verifyV4 checks a V4 signed URL as Cloud Storage does for a request of method to the URL's
// host and path carrying headers: the canonical request rebuilt from what is sent, hashed into
// the string to sign, verified against the signer's public key. It returns nil when the request
// is the one signed.
func verifyV4(pub *rsa.PublicKey, method, rawURL string, headers map[string]string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	q := u.Query()
	sig, err := hex.DecodeString(q.Get("X-Goog-Signature"))
	if err != nil {
		return err
	}
	signed := strings.Split(q.Get("X-Goog-SignedHeaders"), ";")
	sent := map[string]string{"host": u.Host}
	for k, v := range headers {
		sent[strings.ToLower(k)] = strings.TrimSpace(v)
	}
	var canonHeaders strings.Builder
	for _, h := range signed {
		v, ok := sent[h]
		if !ok {
			return fmt.Errorf("signed header %s not sent", h)
		}
		canonHeaders.WriteString(h + ":" + v + "\n")
	}
	var keys []string
	for k := range q {
		if k != "X-Goog-Signature" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var query []string
	for _, k := range keys {
		query = append(query, url.QueryEscape(k)+"="+strings.ReplaceAll(url.QueryEscape(q.Get(k)), "+", "%20"))
	}
	canonical := strings.Join([]string{method, u.EscapedPath(), strings.Join(query, "&"), canonHeaders.String(),
		strings.Join(signed, ";"), "UNSIGNED-PAYLOAD"}, "\n")
	sum := sha256.Sum256([]byte(canonical))
	cred := strings.SplitN(q.Get("X-Goog-Credential"), "/", 2)
	toSign := strings.Join([]string{"GOOG4-RSA-SHA256", q.Get("X-Goog-Date"), cred[1], hex.EncodeToString(sum[:])}, "\n")
	digest := sha256.Sum256([]byte(toSign))
	return rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig)
}

// A signed upload URL admits exactly the PUT it was made for: that object, that content type,
// that size range, create-only. Changing the object, the content type, the size range or the
// precondition breaks the signature, as Cloud Storage checks it (the storage emulator checks none
// of it; see gcsfake).
func TestSignPutBindsObjectTypeAndSize(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	c, err := objects.New(context.Background(), objects.Signer{GoogleAccessID: "genbox-publisher@p.iam.gserviceaccount.com", PrivateKey: pemKey},
		option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, headers, err := c.SignPut("genbox-input", "uploads/acme/0123", "application/pdf", 1000, time.Now().Add(15*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	with := func(k, v string) map[string]string {
		h := map[string]string{}
		for hk, hv := range headers {
			h[hk] = hv
		}
		h[k] = v
		return h
	}
	if err := verifyV4(&key.PublicKey, "PUT", u, headers); err != nil {
		t.Fatalf("the PUT the URL was signed for does not verify: %v", err)
	}
	for _, tc := range []struct {
		name, method, url string
		headers           map[string]string
	}{
		{"another object", "PUT", strings.Replace(u, "uploads/acme/0123", "uploads/other/0123", 1), headers},
		{"more bytes", "PUT", u, with(objects.HeaderLengthRange, "0,1000000")},
		{"another content type", "PUT", u, with(objects.HeaderContentType, "text/html")},
		{"an overwrite", "PUT", u, with(objects.HeaderIfGenerationM, "1796647039170853")},
		{"a read", "GET", u, headers},
	} {
		if err := verifyV4(&key.PublicKey, tc.method, tc.url, tc.headers); err == nil {
			t.Errorf("%s: the signature verifies, want it refused", tc.name)
		}
	}
}

func TestParseURI(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		uri, bucket, object string
		ok                  bool
	}{
		{"gs://my-bucket/a/b.pdf", "my-bucket", "a/b.pdf", true},
		{"gs://my-bucket/", "", "", false},
		{"gs://B/x", "", "", false},
		{"https://storage.googleapis.com/b/o", "", "", false},
		{"gs://my-bucket", "", "", false},
	} {
		b, o, err := objects.ParseURI(tc.uri)
		if (err == nil) != tc.ok || b != tc.bucket || o != tc.object {
			t.Errorf("ParseURI(%q) = %q %q %v", tc.uri, b, o, err)
		}
	}
}
