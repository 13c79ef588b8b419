package testenv

import (
	"context"
	"testing"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// SecretsKey is the local key tests seal webhook secrets with: the GENBOX_WEBHOOK_SECRETS_KEY
// of a service under test, so it opens what Secrets sealed.
const SecretsKey = secretbox.LocalPrefix + "Z2VuYm94LXRlc3RzLW9ubHktbm90LWEtc2VjcmV0LSE="

// Secrets returns a box of SecretsKey.
func Secrets() *secretbox.Box {
	l, err := secretbox.NewLocal(SecretsKey)
	if err != nil {
		panic(err) // SecretsKey is a constant of the right form
	}
	return secretbox.New(l)
}

// Tenant creates tenant id in st with the default limits and a new webhook secret, and returns
// the secret: what a doubles.Receiver of the tenant's webhooks verifies with. A store without a
// secrets box gets Secrets' (what the services under test open with).
func Tenant(t testing.TB, st *store.Store, id string) string {
	t.Helper()
	if st.Secrets == nil {
		st.Secrets = Secrets()
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateTenant(context.Background(), id, store.DefaultLimits(), secret); err != nil {
		t.Fatal(err)
	}
	return secret
}

// GetTask reads task id from st, failing t when it cannot.
func GetTask(t testing.TB, st *store.Store, id string) *protocol.Task {
	t.Helper()
	tk, err := st.GetTask(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}
