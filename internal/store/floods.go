package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/firestore"
)

// FloodsCollection holds the dlqnotifier's flood groups.
const FloodsCollection = "slack_floods"

// maxFloodMembers bounds the dead letter ids a flood remembers (so a repeated notice is not
// counted twice): the document stays small however long the flood.
const maxFloodMembers = 500

// Flood is the slack_floods/{tenant}:{cause} document: the delivery dead letters of one tenant
// dying of one cause (a 404, a redirect) within one window. The first of a window is posted on
// its own, with its buttons; the others are counted here and shown by one Slack message that is
// updated with the count.
type Flood struct {
	Tenant      string    `firestore:"tenant"`
	Cause       string    `firestore:"cause"`
	WindowStart time.Time `firestore:"window_start"`
	First       string    `firestore:"first"`   // the dead letter posted on its own
	Count       int       `firestore:"count"`   // dead letters grouped in this window, First not included
	Members     []string  `firestore:"members"` // the latest grouped dead letter ids, bounded
	LastTaskID  string    `firestore:"last_task_id,omitempty"`
	// Shown is the count the Slack message shows; a poster holds PostEpoch until PostUntil.
	Shown        int        `firestore:"shown"`
	SlackChannel string     `firestore:"slack_channel,omitempty"`
	SlackTS      string     `firestore:"slack_ts,omitempty"`
	PostEpoch    int64      `firestore:"post_epoch"`
	PostUntil    *time.Time `firestore:"post_until,omitempty"`
	UpdatedAt    time.Time  `firestore:"updated_at"`
}

// FloodKey is the document id of tenant's flood of cause.
func FloodKey(tenant, cause string) string {
	return strings.ReplaceAll(tenant, "/", "%2F") + ":" + cause
}

// mutateFlood runs fn over flood key in one transaction and writes what fn leaves, unless fn
// returns ErrNoChange. exists tells fn whether the document was there.
func (s *Store) mutateFlood(ctx context.Context, key string, fn func(f *Flood, exists bool, now time.Time) error) error {
	ref := s.FS.Collection(FloodsCollection).Doc(key)
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		var f Flood
		exists, err := txReadIfExists(tx, ref, "flood", &f)
		if err != nil {
			return err
		}
		now := s.now()
		if err := fn(&f, exists, now); err != nil {
			return err
		}
		f.UpdatedAt = now
		return tx.Set(ref, &f)
	}, s.txOptions()...)
	if err != nil && !errors.Is(err, ErrNoChange) {
		return fmt.Errorf("flood %s: %w", key, err)
	}
	return nil
}

// JoinFlood counts dead letter dlID of taskID in tenant's flood of cause and reports whether it
// is the first of the window (then it is posted on its own). A window lasts window from its
// first dead letter; the next one starts a new window, and a new message. Joining again is
// harmless: a remembered id is not counted twice.
func (s *Store) JoinFlood(ctx context.Context, tenant, cause, dlID, taskID string, window time.Duration) (first bool, err error) {
	err = s.mutateFlood(ctx, FloodKey(tenant, cause), func(f *Flood, exists bool, now time.Time) error {
		first = false
		if !exists || !now.Before(f.WindowStart.Add(window)) {
			epoch := f.PostEpoch
			*f = Flood{Tenant: tenant, Cause: cause, WindowStart: now, First: dlID, LastTaskID: taskID, PostEpoch: epoch}
			first = true
			return nil
		}
		if f.First == dlID {
			first = true
			return ErrNoChange
		}
		if slices.Contains(f.Members, dlID) {
			return ErrNoChange
		}
		f.Count++
		f.Members = append(f.Members, dlID)
		if n := len(f.Members) - maxFloodMembers; n > 0 {
			f.Members = slices.Delete(f.Members, 0, n)
		}
		f.LastTaskID = taskID
		return nil
	})
	return first, err
}

// ClaimFloodPost takes the right to post or update the message of flood key for lease, when its
// count is not shown yet and nobody holds that right. It returns the flood as claimed.
func (s *Store) ClaimFloodPost(ctx context.Context, key string, lease time.Duration) (*Flood, bool, error) {
	var out *Flood
	err := s.mutateFlood(ctx, key, func(f *Flood, exists bool, now time.Time) error {
		out = nil
		if !exists || f.Count == f.Shown || (f.PostUntil != nil && now.Before(*f.PostUntil)) {
			return ErrNoChange
		}
		until := now.Add(lease)
		f.PostEpoch++
		f.PostUntil = &until
		c := *f
		out = &c
		return nil
	})
	return out, out != nil, err
}

// FloodPosted records what the holder of claimed showed: shown dead letters, in the message
// channel/ts (a failed post passes claimed's own Shown and no message). It releases the claim and
// reports whether more dead letters joined meanwhile (the holder should post again).
func (s *Store) FloodPosted(ctx context.Context, key string, claimed *Flood, shown int, channel, ts string) (more bool, err error) {
	err = s.mutateFlood(ctx, key, func(f *Flood, exists bool, now time.Time) error {
		more = false
		if !exists || f.PostEpoch != claimed.PostEpoch {
			return ErrNoChange // the claim lapsed and someone else took it
		}
		f.PostUntil = nil
		if f.WindowStart.Equal(claimed.WindowStart) {
			f.Shown = shown
			if f.SlackTS == "" && ts != "" {
				f.SlackChannel, f.SlackTS = channel, ts
			}
		}
		more = f.Count > f.Shown && shown > claimed.Shown
		return nil
	})
	return more, err
}
