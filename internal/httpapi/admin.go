package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"

	"github.com/genbox-dev/genbox/internal/authlimit"
	"github.com/genbox-dev/genbox/pkg/task"
)

// EnvAdminKey names the admin key every service reads.
const EnvAdminKey = "GENBOX_ADMIN_KEY"

// MinAdminKey is the shortest admin key accepted: it guards every tenant and every dead letter.
const MinAdminKey = 16

// CheckAdminKey reports a configured admin key too short to accept; an empty key (the admin
// routes off) is fine.
func CheckAdminKey(key string) error {
	if key != "" && len(key) < MinAdminKey {
		return fmt.Errorf("%s: must be at least %d characters", EnvAdminKey, MinAdminKey)
	}
	return nil
}

// AdminKey checks the Bearer admin key of the admin routes. Only the key's SHA-256 is kept, and
// a presented key is compared by its own SHA-256 in constant time, so neither the key's length
// nor its bytes leak through timing. The zero AdminKey refuses everything.
type AdminKey struct {
	set bool
	sum [sha256.Size]byte
}

// NewAdminKey returns the check of key; an empty key turns the admin routes off.
func NewAdminKey(key string) AdminKey {
	return AdminKey{set: key != "", sum: sha256.Sum256([]byte(key))}
}

// Enabled reports whether an admin key is configured.
func (k AdminKey) Enabled() bool { return k.set }

// Operator names the holder of the key in audit records: the admin key by the first 8 hex
// digits of its SHA-256, which tells one key from its successor without revealing it.
func (k AdminKey) Operator() string { return "admin key " + hex.EncodeToString(k.sum[:4]) }

// Says is who decided in an audit record when the holder of the key gives a name: Operator,
// with the name kept beside it marked as what it is — said, not verified (the key is all that
// was). A blank name leaves Operator alone.
func (k AdminKey) Says(name string) string {
	if name = strings.TrimSpace(name); name != "" {
		return fmt.Sprintf("%s (says %q)", k.Operator(), name)
	}
	return k.Operator()
}

// Authorize checks r's admin credential: 403 when the admin routes are off, 401 without a
// Bearer credential, 403 for a wrong key (counted in fails; 429 once its client's failures or
// every client's are past their limits); nil when the key is right, whatever anyone's failures.
func (k AdminKey) Authorize(r *http.Request, fails *authlimit.Limiter) *task.Problem {
	if !k.set {
		return Problem(http.StatusForbidden, TypeForbidden, "the admin API is disabled ("+EnvAdminKey+" is not set)")
	}
	key, ok := Bearer(r)
	if !ok {
		return Problem(http.StatusUnauthorized, TypeUnauth, "an Authorization: Bearer <admin key> header is required")
	}
	sum := sha256.Sum256([]byte(key))
	if subtle.ConstantTimeCompare(sum[:], k.sum[:]) != 1 {
		if p := Failed(fails, r); p != nil {
			return p
		}
		return Problem(http.StatusForbidden, TypeForbidden, "the admin key is wrong")
	}
	return nil
}
