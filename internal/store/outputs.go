package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/task"
)

// DefaultOutputTTL is how long a cached output is kept.
const DefaultOutputTTL = 24 * time.Hour

// Output is the outputs/{fingerprint} document: a cached generation. The fingerprint
// (gemini.Fingerprint) covers the tenant and everything that shaped the output; the tenant is
// stored too and checked on every read, so no tenant ever sees another's output or cost.
// Only a fresh, non-degraded, non-stale output of a request that asked for caching belongs here.
type Output struct {
	Fingerprint   string     `firestore:"-"`
	Tenant        string     `firestore:"tenant"`
	Payload       string     `firestore:"payload"`
	Model         string     `firestore:"model"`
	PromptVersion string     `firestore:"prompt_version,omitempty"`
	Usage         task.Usage `firestore:"usage"`
	CostUSD       float64    `firestore:"cost_usd"`
	TaskID        string     `firestore:"task_id,omitempty"` // the task that paid for it
	CreatedAt     time.Time  `firestore:"created_at"`
	ExpireAt      time.Time  `firestore:"expire_at"` // Firestore TTL deletes it some time after
}

// GetOutput reads a cached output of tenant. It returns ErrNotFound when there is none, when it
// has expired (TTL deletion lags by up to a day) or when it belongs to another tenant.
func (s *Store) GetOutput(ctx context.Context, tenant, fingerprint string) (*Output, error) {
	o, err := getDoc(ctx, s.FS.Collection(OutputsCollection).Doc(fingerprint), "output", func(snap *firestore.DocumentSnapshot) (*Output, error) {
		var o Output
		if err := snap.DataTo(&o); err != nil {
			return nil, fmt.Errorf("decode output %s: %w", fingerprint, err)
		}
		return &o, nil
	})
	if err != nil {
		return nil, err
	}
	if o.Tenant != tenant || !s.now().Before(o.ExpireAt) {
		return nil, fmt.Errorf("get output %s: %w", fingerprint, ErrNotFound)
	}
	o.Fingerprint = fingerprint
	return o, nil
}

// DefaultLastGoodTTL is how long the last good output of a subject is kept for stale answers.
const DefaultLastGoodTTL = 30 * 24 * time.Hour

// lastGoodID is the outputs document holding the last good output of a tenant's subject in a
// family variant (on_exhausted: stale). It cannot collide with a fingerprint (hex only).
func lastGoodID(tenant, family, variant, subjectKey string) string {
	b, _ := json.Marshal([]string{tenant, family, variant, subjectKey}) // strings always marshal
	sum := sha256.Sum256(b)
	return "last-good:" + hex.EncodeToString(sum[:])
}

// ErrErased means the task's content was erased (DELETE /v1/tasks/{id}): nothing derived from it
// may be written again.
var ErrErased = errors.New("store: task erased")

// Remembered is what a task's fresh output leaves in outputs/ besides the task: its cache entry
// and the last good output of its subject. Output.TaskID names the task; its tenant is the
// entries' tenant. Record only fresh outputs (never a stale one, never a degraded cache entry).
type Remembered struct {
	Output Output
	// Fingerprint, when set, writes the cache entry outputs/{Fingerprint} for CacheTTL
	// (DefaultOutputTTL when 0), replacing an older entry.
	Fingerprint string
	CacheTTL    time.Duration
	// SubjectKey, when set, writes the last good output of the tenant's subject in
	// Family/Variant for DefaultLastGoodTTL: a family with on_exhausted: stale answers with it
	// when every model is unavailable.
	Family, Variant, SubjectKey string
}

// Remember writes r in one transaction that reads r's task first and writes nothing if the task
// was erased (ErrErased) or is gone (ErrNotFound): an erase that commits first wins, and one
// that commits after finds the entries by their task_id (EraseOutputs). So no erased output is
// ever written back after the erase that removed it.
func (s *Store) Remember(ctx context.Context, r Remembered) error {
	o := r.Output
	if o.Tenant == "" || o.TaskID == "" {
		return fmt.Errorf("remember output: tenant and task id are required")
	}
	if r.Fingerprint == "" && r.SubjectKey == "" {
		return nil
	}
	outputs := s.FS.Collection(OutputsCollection)
	taskRef := s.Tasks().Doc(o.TaskID)
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		snap, err := tx.Get(taskRef)
		if status.Code(err) == codes.NotFound {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if t, err := DecodeTask(snap); err != nil {
			return err
		} else if t.ErasedAt != nil {
			return ErrErased
		}
		now := s.now()
		if r.Fingerprint != "" {
			c := o
			c.CreatedAt, c.ExpireAt = now, now.Add(cmp.Or(r.CacheTTL, DefaultOutputTTL))
			if err := tx.Set(outputs.Doc(r.Fingerprint), c); err != nil {
				return err
			}
		}
		if r.SubjectKey != "" {
			g := o
			g.CreatedAt, g.ExpireAt = now, now.Add(DefaultLastGoodTTL)
			if err := tx.Set(outputs.Doc(lastGoodID(o.Tenant, r.Family, r.Variant, r.SubjectKey)), g); err != nil {
				return err
			}
		}
		return nil
	}, s.txOptions()...)
	if err != nil {
		return fmt.Errorf("remember output of task %s: %w", o.TaskID, err)
	}
	return nil
}

// EraseOutputs removes what an erased task left outside its document: its preview
// previews/{id} (a streamed task's text so far, kept an hour after its last write, which may be
// the whole output), its cache entry outputs/{fingerprint} (whichever task wrote it: the same
// tenant's identical request) and every entry the task wrote itself (its cache entry and the
// last good output of its subject, if no later output replaced it). Call it after the erase has
// committed: a Remember that raced with the erase either committed before it (found here) or
// saw it (wrote nothing), and a finished task's previews are no longer written.
func (s *Store) EraseOutputs(ctx context.Context, taskID, fingerprint string) error {
	outputs := s.FS.Collection(OutputsCollection)
	refs := []*firestore.DocumentRef{s.FS.Collection(PreviewsCollection).Doc(taskID)}
	if fingerprint != "" {
		refs = append(refs, outputs.Doc(fingerprint))
	}
	snaps, err := outputs.Where("task_id", "==", taskID).Select().Documents(ctx).GetAll()
	if err != nil {
		return fmt.Errorf("erase outputs of task %s: %w", taskID, err)
	}
	for _, snap := range snaps {
		refs = append(refs, snap.Ref)
	}
	for _, ref := range refs {
		if _, err := ref.Delete(ctx); err != nil && status.Code(err) != codes.NotFound {
			return fmt.Errorf("erase output %s of task %s: %w", ref.ID, taskID, err)
		}
	}
	return nil
}

// GetLastGood reads the last good output of tenant's subjectKey in family/variant, or ErrNotFound.
func (s *Store) GetLastGood(ctx context.Context, tenant, family, variant, subjectKey string) (*Output, error) {
	return s.GetOutput(ctx, tenant, lastGoodID(tenant, family, variant, subjectKey))
}
