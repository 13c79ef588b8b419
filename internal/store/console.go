package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Collections of the operators' console (internal/console).
const (
	ConsoleSessionsCollection = "console_sessions"
	ConsoleLoginsCollection   = "console_logins"
)

// ErrExpired means a console login token or session is unknown, used or expired.
var ErrExpired = errors.New("store: expired or unknown")

// ConsoleSession is the console_sessions/{sha256(session id)} document: who is logged in — the
// admin key that issued the session, and the name its holder gave — the CSRF token of their
// forms, and until when.
type ConsoleSession struct {
	Issuer    string    `firestore:"issuer"` // httpapi.AdminKey.Operator of the key that issued it
	Operator  string    `firestore:"operator"`
	CSRF      string    `firestore:"csrf"`
	CreatedAt time.Time `firestore:"created_at"`
	ExpireAt  time.Time `firestore:"expire_at"` // TTL
}

// consoleLogin is the console_logins/{sha256(token)} document: a one-time login.
type consoleLogin struct {
	Issuer   string    `firestore:"issuer"`
	Operator string    `firestore:"operator"`
	ExpireAt time.Time `firestore:"expire_at"` // TTL
}

// secretID is the document id of a secret: only its hash is stored.
func secretID(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// CreateConsoleLogin stores a one-time login token for operator, issued by issuer (the admin
// key, as httpapi.AdminKey.Operator names it), valid for ttl.
func (s *Store) CreateConsoleLogin(ctx context.Context, token, issuer, operator string, ttl time.Duration) error {
	l := consoleLogin{Issuer: issuer, Operator: operator, ExpireAt: s.now().Add(ttl)}
	if _, err := s.FS.Collection(ConsoleLoginsCollection).Doc(secretID(token)).Create(ctx, l); err != nil {
		return fmt.Errorf("create console login: %w", err)
	}
	return nil
}

// RedeemConsoleLogin uses token once: it deletes the login and, in the same transaction, creates
// the session sess under sessionID, with the login's operator. An unknown, used or expired token
// is ErrExpired, and so is one issued by another admin key than sess.Issuer: rotating the key
// ends the links it issued.
func (s *Store) RedeemConsoleLogin(ctx context.Context, token, sessionID string, sess ConsoleSession) (ConsoleSession, error) {
	lref := s.FS.Collection(ConsoleLoginsCollection).Doc(secretID(token))
	sref := s.FS.Collection(ConsoleSessionsCollection).Doc(secretID(sessionID))
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		snap, err := tx.Get(lref)
		if status.Code(err) == codes.NotFound {
			return ErrExpired
		}
		if err != nil {
			return err
		}
		var l consoleLogin
		if err := snap.DataTo(&l); err != nil {
			return fmt.Errorf("decode console login: %w", err)
		}
		now := s.now()
		if !now.Before(l.ExpireAt) || l.Issuer != sess.Issuer {
			return ErrExpired
		}
		sess.Operator, sess.CreatedAt = l.Operator, now
		if err := tx.Delete(lref); err != nil {
			return err
		}
		return tx.Create(sref, sess)
	}, s.txOptions()...)
	if err != nil {
		return ConsoleSession{}, fmt.Errorf("redeem console login: %w", err)
	}
	return sess, nil
}

// ConsoleSessionOf reads the live session of sessionID issued by issuer, or ErrExpired: rotating
// the admin key ends the sessions it issued.
func (s *Store) ConsoleSessionOf(ctx context.Context, sessionID, issuer string) (ConsoleSession, error) {
	snap, err := s.FS.Collection(ConsoleSessionsCollection).Doc(secretID(sessionID)).Get(ctx)
	if status.Code(err) == codes.NotFound {
		return ConsoleSession{}, ErrExpired
	}
	if err != nil {
		return ConsoleSession{}, fmt.Errorf("read console session: %w", err)
	}
	var sess ConsoleSession
	if err := snap.DataTo(&sess); err != nil {
		return ConsoleSession{}, fmt.Errorf("decode console session: %w", err)
	}
	if !s.now().Before(sess.ExpireAt) || sess.Issuer != issuer {
		return ConsoleSession{}, ErrExpired
	}
	return sess, nil
}

// DeleteConsoleSession ends a session (logout).
func (s *Store) DeleteConsoleSession(ctx context.Context, sessionID string) error {
	if _, err := s.FS.Collection(ConsoleSessionsCollection).Doc(secretID(sessionID)).Delete(ctx); err != nil {
		return fmt.Errorf("delete console session: %w", err)
	}
	return nil
}

// ListTenants reads every tenant (a small collection: one document per tenant).
func (s *Store) ListTenants(ctx context.Context) ([]*Tenant, error) {
	return readAll(s.FS.Collection(TenantsCollection).Documents(ctx), "list tenants", decodeTenant)
}

// ListBreakers reads every breakers/{model} document (one per model that ever changed state).
func (s *Store) ListBreakers(ctx context.Context) ([]Breaker, error) {
	return readAll(s.FS.Collection(BreakersCollection).Documents(ctx), "list breakers", func(snap *firestore.DocumentSnapshot) (Breaker, error) {
		var b Breaker
		if err := snap.DataTo(&b); err != nil {
			return b, fmt.Errorf("decode breaker %s: %w", snap.Ref.ID, err)
		}
		return b, nil
	})
}

// TaskFilter selects tasks for the console. Tenant empty: every tenant's; State and Family empty:
// any; Since and Until bound created_at when set.
type TaskFilter struct {
	Tenant, Family string
	State          task.State
	Since, Until   time.Time
	// Limit bounds the tasks returned (newest first), and those read per tenant.
	Limit int
}

// consoleFields are what the console's lists and overview read of a task.
var consoleFields = []string{"tenant", "state", "family", "variant", "model", "mode", "usage", "cost_usd", "cache_hit",
	"degraded", "stale", "replay", "attempts", "delivery.state", "delivery.attempts", "created_at", "completed_at", "batch_job"}

// SearchTasks returns up to f.Limit tasks matching f, newest first: one query per tenant (the
// given one, or every tenant's, merged), each on the tenant's composite index — queries
// "tasks-by-tenant", "tasks-by-tenant-state", "console-tasks-by-tenant-family" and
// "console-tasks-by-tenant-state-family" — as created_at is exempt from single-field indexing.
// The tasks hold only consoleFields.
func (s *Store) SearchTasks(ctx context.Context, f TaskFilter) ([]*protocol.Task, error) {
	tenants := []string{f.Tenant}
	if f.Tenant == "" {
		all, err := s.ListTenants(ctx)
		if err != nil {
			return nil, err
		}
		tenants = tenants[:0]
		for _, t := range all {
			tenants = append(tenants, t.ID)
		}
	}
	var out []*protocol.Task
	for _, tenant := range tenants {
		q := s.Tasks().Where("tenant", "==", tenant)
		if f.State != "" {
			q = q.Where("state", "==", string(f.State))
		}
		if f.Family != "" {
			q = q.Where("family", "==", f.Family)
		}
		if !f.Since.IsZero() {
			q = q.Where("created_at", ">=", f.Since)
		}
		if !f.Until.IsZero() {
			q = q.Where("created_at", "<", f.Until)
		}
		ts, err := readAll(q.OrderBy("created_at", firestore.Desc).Limit(f.Limit).Select(consoleFields...).Documents(ctx),
			"search tasks of "+tenant, DecodeTask)
		if err != nil {
			return nil, err
		}
		out = append(out, ts...)
	}
	slices.SortFunc(out, func(a, b *protocol.Task) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	if len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// CountTasks counts the tasks in each state (query "tasks-by-state": a count aggregation per
// state, reading no documents).
func (s *Store) CountTasks(ctx context.Context) (map[task.State]int64, error) {
	return s.CountStates(ctx, task.States...)
}

// countOf reads a count aggregation's value.
func countOf(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case interface{ GetIntegerValue() int64 }:
		return n.GetIntegerValue()
	}
	return 0
}

// DeadLettersOfTask lists the dead letters of one task, oldest first (query
// "dead-letters-by-task").
func (s *Store) DeadLettersOfTask(ctx context.Context, taskID string) ([]*DeadLetter, error) {
	out, err := readAll(s.DeadLetters().Where("task_id", "==", taskID).Documents(ctx), "dead letters of "+taskID, decodeDeadLetter)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b *DeadLetter) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}
