package protocol

import (
	"time"

	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/task"
)

// What is due, in one place (docs/architecture.md §0). Each part of a task document that can be
// pending — the task itself, its webhook delivery, each DLQ notice, a decision's unpublished
// nudges, a Slack update, an erased task's Files API copies to delete — says in one function
// both when it needs its nudge (its part of due_at, DueAt) and whether it needs it at now (what
// the sweeper nudges, the worker claims and the resulthandler delivers). A rule changed here
// changes all of them.

// need is one pending part of a task document.
type need struct {
	at  time.Time // when it needs its nudge: its part of due_at
	due bool      // whether it needs it at now
}

// needs lists what t waits for at now: one need for each pending part.
func needs(t *Task, now time.Time) []need {
	var out []need
	add := func(n need, pending bool) {
		if pending {
			out = append(out, n)
		}
	}
	add(taskNeed(t, now))
	add(t.Delivery.need(now, 0))
	for _, n := range t.Notices {
		add(n.need(now), true)
	}
	add(t.Decision.need(now))
	add(t.SlackUpdate.need(now))
	add(t.FileErase.need(now))
	return out
}

// taskNeed is what the task itself waits for: scheduled past its start, queued or waiting past
// its backoff, any of them past its run_before (its claim then fails it as expired, backoff or
// not), or running under an expired lease (running without a lease is never written; it is
// recovered at once). ok is false once the task has ended.
func taskNeed(t *Task, now time.Time) (n need, ok bool) {
	switch t.State {
	case task.StateScheduled, task.StateQueued, task.StateWaiting:
		n.at = t.CreatedAt
		if t.NotBefore != nil {
			n.at = *t.NotBefore
		}
		if t.RunBefore != nil && t.RunBefore.Before(n.at) {
			n.at = *t.RunBefore
		}
		// A scheduled task's not_before is its start_after: a stray nudge never starts it early.
		n.due = t.NotBefore == nil || !now.Before(*t.NotBefore) || t.Expired(now)
		return n, true
	case task.StateRunning:
		n.at, n.due = now, !t.Lease.Live(now)
		if t.Lease.ExpiresAt != nil {
			n.at = *t.Lease.ExpiresAt
		}
		return n, true
	}
	return need{}, false
}

// leasedNeed is a leased piece of work retried with a backoff (a delivery, a notice): it waits
// for its live lease to expire, else for its next attempt, else nothing.
func leasedNeed(l claim.Lease, next *time.Time, now time.Time) need {
	switch {
	case l.Live(now):
		return need{at: *l.ExpiresAt}
	case next != nil:
		return need{at: *next, due: !now.Before(*next)}
	}
	return need{at: now, due: true}
}

// backoffNeed is follow-up work retried with a backoff and no lease (a decision's nudges, a
// Slack update, Files API copies to delete): it waits for its next attempt; first is when it needs its first one.
func backoffNeed(first time.Time, next *time.Time, now time.Time) need {
	if next != nil {
		return need{at: *next, due: !now.Before(*next)}
	}
	return need{at: first, due: true}
}

// Expired reports whether t's run_before has passed: its claim fails it as expired, and no
// backoff holds it any longer.
func (t *Task) Expired(now time.Time) bool {
	return t.RunBefore != nil && !now.Before(*t.RunBefore)
}

// TaskDue reports whether the task itself needs a worker at now: the sweeper nudges it and a
// worker claims it then, never before.
func TaskDue(t *Task, now time.Time) bool { return isDue(taskNeed(t, now)) }

// Claimable reports whether the delivery may be claimed at now: pending, no live lease, past its
// retry backoff. reserved, when not 0, is the epoch of a reservation the claimer holds
// (ReserveDelivery): that lease does not stand in its way.
func (d *Delivery) Claimable(now time.Time, reserved int64) bool { return isDue(d.need(now, reserved)) }

// Due reports whether the notice needs its nudge at now: no live lease, past its retry backoff.
func (n Notice) Due(now time.Time) bool { return n.need(now).due }

// Due reports whether the decision has nudges still to publish at now.
func (d *Decision) Due(now time.Time) bool { return isDue(d.need(now)) }

// Due reports whether the follow-up work has keys to carry out at now.
func (p *Pending) Due(now time.Time) bool { return isDue(p.need(now)) }

func isDue(n need, pending bool) bool { return pending && n.due }

func (d *Delivery) need(now time.Time, reserved int64) (need, bool) {
	if d.State != task.DeliveryPending {
		return need{}, false
	}
	l := d.Lease
	if reserved > 0 && l.HeldBy(NudgeOwner, reserved, now) {
		l = claim.Lease{}
	}
	return leasedNeed(l, d.NextAttemptAt, now), true
}

func (n Notice) need(now time.Time) need { return leasedNeed(n.Lease, n.NextAttemptAt, now) }

func (d *Decision) need(now time.Time) (need, bool) {
	if d == nil || len(d.Topics) == 0 {
		return need{}, false
	}
	return backoffNeed(d.At, d.NextAttemptAt, now), true
}

func (p *Pending) need(now time.Time) (need, bool) {
	if p == nil || len(p.Keys) == 0 {
		return need{}, false
	}
	return backoffNeed(now, p.NextAttemptAt, now), true
}
