package protocol_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

var (
	now   = time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)
	rules = protocol.Rules{Owner: "w1", LeaseTTL: time.Minute, MaxAttempts: 3, ClaimCap: 2,
		NudgeGrace: 30 * time.Second, DeliveryLease: 90 * time.Second}
)

const epoch = 4

func at(d time.Duration) *time.Time {
	t := now.Add(d)
	return &t
}

// running is a task w1 holds at epoch, its lease live for another 30 s.
func running() *protocol.Task {
	return &protocol.Task{ID: "t1", Tenant: "acme", State: task.StateRunning, Replay: 1, Claims: 1,
		Lease: claim.Lease{Owner: "w1", Epoch: epoch, ExpiresAt: at(30 * time.Second)}}
}

// queued is a task waiting for its first claim.
func queued() *protocol.Task {
	return &protocol.Task{ID: "t1", Tenant: "acme", State: task.StateQueued, AwaitsSlot: true, Lease: claim.Lease{Epoch: epoch - 1}}
}

// change is one transition's case: the task before, the transition and what it answers, and
// what it must change.
type change struct {
	name   string
	before func() *protocol.Task
	apply  func(t *protocol.Task) any // the transition, returning its answer (nil: none)
	want   func(t *protocol.Task)     // applied to a copy of before: the only changes expected
	answer any
}

func run(t *testing.T, cases []change) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, want := c.before(), c.before()
			answer := c.apply(got)
			c.want(want)
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("task after the change (-want +got):\n%s", d)
			}
			if d := cmp.Diff(c.answer, answer, cmpopts.EquateErrors()); d != "" {
				t.Errorf("the transition's answer (-want +got):\n%s", d)
			}
		})
	}
}

// do is a transition without an answer.
func do(f func(t *protocol.Task)) func(t *protocol.Task) any {
	return func(t *protocol.Task) any {
		f(t)
		return nil
	}
}

// outcome is SendBack's answer.
type outcome struct{ Dead, Due bool }

func released(t *protocol.Task) {
	t.State, t.Claims = task.StateQueued, 0
	t.Lease.Owner, t.Lease.ExpiresAt = "", nil
}

func TestClaim(t *testing.T) {
	t.Parallel()
	run(t, []change{
		{name: "a queued task runs under a new epoch", before: queued, apply: claimed, want: func(t *protocol.Task) {
			t.State, t.AwaitsSlot = task.StateRunning, false
			t.Lease = claim.Lease{Owner: "w1", Epoch: epoch, ExpiresAt: at(time.Minute)}
		}, answer: false},
		{name: "a live lease of another owner is refused", before: func() *protocol.Task {
			t := running()
			t.Lease.Owner = "w2"
			return t
		}, apply: claimed, want: func(*protocol.Task) {}, answer: true},
	})
}

// claimed is Claim answering whether another owner held the lease.
func claimed(t *protocol.Task) any { return errors.Is(rules.Claim(t, now), claim.ErrHeld) }

func TestTakeOver(t *testing.T) {
	t.Parallel()
	run(t, []change{
		{name: "below the claim cap it counts the claim", before: running, apply: takeOver,
			want: func(t *protocol.Task) { t.Claims = 2 }, answer: false},
		{name: "past the claim cap the task dies with a notice", before: func() *protocol.Task {
			t := running()
			t.Claims = 2
			return t
		}, apply: takeOver, want: func(t *protocol.Task) {
			t.Claims = 3
			t.Error = &protocol.TaskError{Kind: task.KindCrash, Message: "the task's lease expired 2 times without a release: it kills its worker"}
			dead(t)
		}, answer: true},
	})
}

// dead is what Kill changes on top of the error.
func dead(t *protocol.Task) {
	t.Notices = append(t.Notices, protocol.Notice{Stage: task.StageGeneration, Replay: t.Replay, NextAttemptAt: at(30 * time.Second)})
	ended(t, task.StateDead)
}

// ended is what Finish changes on a task without a callback.
func ended(t *protocol.Task, s task.State) {
	t.State = s
	t.Lease.Owner, t.Lease.ExpiresAt = "", nil
	t.NotBefore = nil
	t.CompletedAt = at(0)
	t.Delivery.State = task.DeliveryNone
}

func TestFinish(t *testing.T) {
	t.Parallel()
	withCallback := func() *protocol.Task {
		t := running()
		t.CallbackURL = "https://example.com/hook"
		return t
	}
	run(t, []change{
		{name: "without a callback nothing is delivered", before: running, apply: do(func(t *protocol.Task) { rules.Finish(t, task.StateSucceeded, now) }),
			want: func(t *protocol.Task) { ended(t, task.StateSucceeded) }},
		{name: "with a callback its delivery is reserved for the holder's nudge", before: withCallback, apply: do(func(t *protocol.Task) {
			rules.Finish(t, task.StateCancelled, now)
			t.Delivery.Payload = "" // the frozen event: protocol.Task.QueueEvent's tests read it
		}), want: func(t *protocol.Task) {
			ended(t, task.StateCancelled)
			t.Delivery = protocol.Delivery{State: task.DeliveryPending, EventID: task.EventID("t1", task.EventCancelled, 1),
				EventType: task.EventCancelled, Attempts: 1, FirstAttemptAt: at(0), NextAttemptAt: at(0),
				Lease: claim.Lease{Owner: protocol.NudgeOwner, Epoch: 1, ExpiresAt: at(90 * time.Second)}}
		}},
	})
}

func takeOver(t *protocol.Task) any { return rules.TakeOver(t, now) }

func TestExpireFailKill(t *testing.T) {
	t.Parallel()
	e := &protocol.TaskError{Kind: task.KindPermanent, Message: "no"}
	run(t, []change{
		{name: "expire fails a waiting task", before: queued, apply: do(func(t *protocol.Task) { rules.Expire(t, now) }), want: func(t *protocol.Task) {
			t.AwaitsSlot = false
			t.Error = &protocol.TaskError{Kind: task.KindExpired, Message: "run_before passed before the model was called"}
			ended(t, task.StateFailed)
		}},
		{name: "fail records the error", before: running, apply: do(func(t *protocol.Task) { rules.Fail(t, e, now) }), want: func(t *protocol.Task) {
			t.Error = e
			ended(t, task.StateFailed)
		}},
		{name: "kill leaves a notice after the grace", before: running, apply: do(func(t *protocol.Task) { rules.Kill(t, now) }), want: dead},
	})
}

func TestHolds(t *testing.T) {
	t.Parallel()
	holds := func(t *protocol.Task) any { return rules.Holds(t, epoch) }
	with := func(change func(*protocol.Task)) func() *protocol.Task {
		return func() *protocol.Task {
			t := running()
			change(t)
			return t
		}
	}
	unchanged := func(*protocol.Task) {}
	run(t, []change{
		{name: "mine, running", before: running, apply: holds, want: unchanged, answer: true},
		{name: "lapsed but not taken over", before: with(func(t *protocol.Task) { t.Lease.ExpiresAt = at(-time.Hour) }), apply: holds, want: unchanged, answer: true},
		{name: "taken over", before: with(func(t *protocol.Task) { t.Lease.Epoch++ }), apply: holds, want: unchanged, answer: false},
		{name: "another owner", before: with(func(t *protocol.Task) { t.Lease.Owner = "w2" }), apply: holds, want: unchanged, answer: false},
		{name: "no longer running", before: with(func(t *protocol.Task) { t.State = task.StateCancelled }), apply: holds, want: unchanged, answer: false},
		{name: "output stored", before: with(func(t *protocol.Task) { t.OutputAt = at(0) }), apply: holds, want: unchanged, answer: false},
	})
}

func TestRenew(t *testing.T) {
	t.Parallel()
	renew := func(t *protocol.Task) any { return rules.Renew(t, epoch, now) }
	extended := func(t *protocol.Task) { t.Lease.ExpiresAt = at(time.Minute) }
	run(t, []change{
		{name: "held: extended", before: running, apply: renew, want: extended, answer: error(nil)},
		{name: "lapsed, not taken over: extended", before: func() *protocol.Task {
			t := running()
			t.Lease.ExpiresAt = at(-time.Hour)
			return t
		}, apply: renew, want: extended, answer: error(nil)},
		{name: "output stored: the call may stop", before: func() *protocol.Task {
			t := running()
			t.OutputAt = at(0)
			return t
		}, apply: renew, want: func(*protocol.Task) {}, answer: protocol.ErrOutputStored},
		{name: "taken over: lost", before: func() *protocol.Task {
			t := running()
			t.Lease.Epoch++
			return t
		}, apply: renew, want: func(*protocol.Task) {}, answer: claim.ErrLeaseLost},
	})
}

func TestExtend(t *testing.T) {
	t.Parallel()
	job := rules.As(protocol.BatchOwner("j1"))
	extend := func(t *protocol.Task) any { return job.Extend(t, epoch, now, time.Hour) }
	inJob := func() *protocol.Task {
		t := running()
		t.Lease.Owner, t.Lease.ExpiresAt = protocol.BatchOwner("j1"), at(-time.Minute)
		return t
	}
	run(t, []change{
		{name: "an expired lease of the job is extended", before: inJob, apply: extend,
			want: func(t *protocol.Task) { t.Lease.ExpiresAt = at(time.Hour) }, answer: true},
		{name: "a task the job no longer holds is left alone", before: running, apply: extend,
			want: func(*protocol.Task) {}, answer: false},
	})
}

func TestReleaseRequeue(t *testing.T) {
	t.Parallel()
	run(t, []change{
		{name: "release keeps not_before", before: func() *protocol.Task {
			t := running()
			t.NotBefore = at(-time.Hour)
			return t
		}, apply: do(func(t *protocol.Task) { rules.Release(t, epoch) }), want: released},
		{name: "requeue sets not_before", before: running, apply: do(func(t *protocol.Task) { rules.Requeue(t, epoch, now.Add(time.Minute)) }),
			want: func(t *protocol.Task) {
				released(t)
				t.NotBefore = at(time.Minute)
			}},
	})
}

func TestRetry(t *testing.T) {
	t.Parallel()
	transient := &protocol.TaskError{Kind: task.KindTransient, Message: "503"}
	network := &protocol.TaskError{Kind: task.KindNetwork, Message: "reset"}
	delay := func(n int) time.Duration { return time.Duration(n) * time.Second }
	parked := func(attempts int) func() *protocol.Task {
		return func() *protocol.Task {
			t := running()
			t.Attempts, t.Parks = attempts, 2
			return t
		}
	}
	retry := func(e *protocol.TaskError, count bool) func(*protocol.Task) any {
		return func(t *protocol.Task) any { return rules.Retry(t, epoch, now, e, count, delay) }
	}
	run(t, []change{
		{name: "an attempt is counted; a model answered: parks reset", before: parked(1), apply: retry(transient, true), want: func(t *protocol.Task) {
			released(t)
			t.Attempts, t.Parks, t.Error, t.NotBefore = 2, 0, transient, at(2*time.Second)
		}, answer: false},
		{name: "a network failure keeps the park count", before: parked(1), apply: retry(network, true), want: func(t *protocol.Task) {
			released(t)
			t.Attempts, t.Error, t.NotBefore = 2, network, at(2*time.Second)
		}, answer: false},
		{name: "rate limits count no attempt and never kill", before: parked(3), apply: retry(transient, false), want: func(t *protocol.Task) {
			released(t)
			t.Parks, t.Error, t.NotBefore = 0, transient, at(3*time.Second)
		}, answer: false},
		{name: "the last attempt kills", before: parked(2), apply: retry(transient, true), want: func(t *protocol.Task) {
			t.Attempts, t.Error = 3, transient
			dead(t)
		}, answer: true},
	})
}

func TestShedParkBudgetWait(t *testing.T) {
	t.Parallel()
	delay := func(n int) time.Duration { return time.Duration(n) * time.Minute }
	budget := &protocol.TaskError{Kind: task.KindBudget, Message: "spent"}
	run(t, []change{
		{name: "shed counts sheds, not attempts", before: running, apply: do(func(t *protocol.Task) { rules.Shed(t, epoch, now, delay) }), want: func(t *protocol.Task) {
			released(t)
			t.Sheds, t.NotBefore = 1, at(time.Minute)
		}},
		{name: "park waits its backoff", before: running, apply: do(func(t *protocol.Task) { rules.Park(t, epoch, now, delay, nil) }), want: func(t *protocol.Task) {
			released(t)
			t.State, t.Parks, t.NotBefore = task.StateWaiting, 1, at(time.Minute)
		}},
		{name: "park waits no later than the chain's next call", before: running, apply: do(func(t *protocol.Task) { rules.Park(t, epoch, now, delay, at(10*time.Second)) }),
			want: func(t *protocol.Task) {
				released(t)
				t.State, t.Parks, t.NotBefore = task.StateWaiting, 1, at(10*time.Second)
			}},
		{name: "park on a chain available now is due now", before: running, apply: do(func(t *protocol.Task) { rules.Park(t, epoch, now, delay, at(-time.Hour)) }),
			want: func(t *protocol.Task) {
				released(t)
				t.State, t.Parks, t.NotBefore = task.StateWaiting, 1, at(0)
			}},
		{name: "a budget wait ends at the day's reset", before: running, apply: do(func(t *protocol.Task) { rules.BudgetWait(t, epoch, now, budget, 0) }),
			want: func(t *protocol.Task) {
				released(t)
				t.State, t.Error, t.NotBefore = task.StateWaiting, budget, at(6*time.Hour)
			}},
		{name: "or at its retry when sooner", before: running, apply: do(func(t *protocol.Task) { rules.BudgetWait(t, epoch, now, budget, time.Minute) }),
			want: func(t *protocol.Task) {
				released(t)
				t.State, t.Error, t.NotBefore = task.StateWaiting, budget, at(time.Minute)
			}},
		{name: "a retry past the reset waits for the reset", before: running, apply: do(func(t *protocol.Task) { rules.BudgetWait(t, epoch, now, budget, 7*time.Hour) }),
			want: func(t *protocol.Task) {
				released(t)
				t.State, t.Error, t.NotBefore = task.StateWaiting, budget, at(6*time.Hour)
			}},
	})
}

func TestBatch(t *testing.T) {
	t.Parallel()
	job := rules.As(protocol.BatchOwner("j1"))
	inJob := func(notBefore time.Duration) func() *protocol.Task {
		return func() *protocol.Task {
			t := running()
			t.Mode, t.BatchJob, t.NotBefore = task.ModeBatch, "j1", at(notBefore)
			t.Lease.Owner = protocol.BatchOwner("j1")
			return t
		}
	}
	quality := &protocol.TaskError{Kind: task.KindQuality, Message: "invalid"}
	sendBack := func(e *protocol.TaskError, online bool) func(*protocol.Task) any {
		return func(t *protocol.Task) any {
			d, due := job.SendBack(t, epoch, now, "flash", e, online)
			return outcome{Dead: d, Due: due}
		}
	}
	run(t, []change{
		{name: "hold waits for a batch until its time in batches ends", before: running,
			apply: do(func(t *protocol.Task) { rules.HoldForBatch(t, epoch, "flash", now.Add(time.Hour)) }), want: func(t *protocol.Task) {
				released(t)
				t.BatchModel, t.NotBefore = "flash", at(time.Hour)
			}},
		{name: "run online takes it out of batching", before: func() *protocol.Task {
			t := running()
			t.BatchModel = "flash"
			return t
		}, apply: do(protocol.RunOnline), want: func(t *protocol.Task) { t.BatchModel, t.BatchOnline = "", true }},
		{name: "a lost job sends it back to the next batch", before: inJob(time.Hour), apply: sendBack(nil, false), want: func(t *protocol.Task) {
			released(t)
			t.BatchModel = "flash"
		}, answer: outcome{}},
		{name: "past its time in batches it is due now", before: inJob(-time.Second), apply: sendBack(nil, false), want: func(t *protocol.Task) {
			released(t)
			t.NotBefore = at(0)
		}, answer: outcome{Due: true}},
		{name: "online after a quality failure, an attempt counted", before: inJob(time.Hour), apply: sendBack(quality, true), want: func(t *protocol.Task) {
			released(t)
			t.Attempts, t.Error, t.BatchOnline, t.NotBefore = 1, quality, true, at(0)
		}, answer: outcome{Due: true}},
		{name: "the last attempt kills", before: func() *protocol.Task {
			t := inJob(time.Hour)()
			t.Attempts = 2
			return t
		}, apply: sendBack(quality, true), want: func(t *protocol.Task) {
			t.Attempts, t.Error = 3, quality
			dead(t)
		}, answer: outcome{Dead: true}},
	})
}

func TestLeaveBatch(t *testing.T) {
	t.Parallel()
	waiting := func() *protocol.Task {
		t := queued()
		t.AwaitsSlot, t.BatchModel, t.NotBefore = false, "flash", at(time.Hour)
		return t
	}
	for _, c := range []struct {
		name  string
		model string
		want  bool
	}{{"waiting for that batch", "flash", true}, {"waiting for another", "pro", false}} {
		tk := waiting()
		if got := protocol.LeaveBatch(tk, c.model, now); got != c.want {
			t.Errorf("%s: LeaveBatch = %v, want %v", c.name, got, c.want)
		}
		if c.want && (tk.BatchModel != "" || !tk.NotBefore.Equal(now)) {
			t.Errorf("%s: batch_model %q, not_before %v; want none, due now", c.name, tk.BatchModel, tk.NotBefore)
		}
	}
}

func TestCommitOutput(t *testing.T) {
	t.Parallel()
	o := protocol.Output{Text: "{}", Model: "flash", Tier: gemini.TierFlex, Cached: true, Fingerprint: "fp"}
	run(t, []change{
		{name: "the output ends the task as succeeded", before: running, apply: do(func(t *protocol.Task) { rules.CommitOutput(t, epoch, o, now) }), want: func(t *protocol.Task) {
			t.Output, t.OutputEpoch, t.OutputAt = "{}", epoch, at(0)
			t.Model, t.Tier, t.CacheHit, t.Fingerprint = "flash", string(gemini.TierFlex), true, "fp"
			ended(t, task.StateSucceeded)
		}},
	})
	for _, c := range []struct {
		name         string
		change       func(*protocol.Task)
		takes, mine  bool
		replay       int
		outputBefore bool
	}{
		{"running", func(*protocol.Task) {}, true, false, 1, false},
		{"taken over and running again: a zombie's output still counts", func(t *protocol.Task) { t.Lease.Epoch++ }, true, false, 1, false},
		{"parked meanwhile", func(t *protocol.Task) { t.State = task.StateWaiting }, true, false, 1, false},
		{"cancelled: never revived", func(t *protocol.Task) { t.State = task.StateCancelled }, false, false, 1, false},
		{"regenerated since the claim", func(t *protocol.Task) { t.Replay = 2 }, false, false, 1, false},
		{"my own output, found by a retried commit", func(t *protocol.Task) {
			t.OutputAt, t.OutputEpoch, t.State = at(0), epoch, task.StateSucceeded
		}, false, true, 1, true},
		{"another's output", func(t *protocol.Task) {
			t.OutputAt, t.OutputEpoch, t.State = at(0), epoch+1, task.StateSucceeded
		}, false, false, 1, true},
	} {
		tk := running()
		c.change(tk)
		if got := protocol.TakesOutput(tk, c.replay); got != c.takes {
			t.Errorf("%s: TakesOutput = %v, want %v", c.name, got, c.takes)
		}
		if got := protocol.OutputMine(tk, c.replay, epoch); got != c.mine {
			t.Errorf("%s: OutputMine = %v, want %v", c.name, got, c.mine)
		}
	}
}

func TestAddSpend(t *testing.T) {
	t.Parallel()
	res := gemini.Result{Calls: 2, CostUSD: 0.5, Usage: task.Usage{PromptTokens: 10, OutputTokens: 5},
		InDoubt:  task.Usage{PromptTokens: 3},
		Attempts: []gemini.Attempt{{Number: 1, Model: "flash", Class: gemini.Transient, Start: now}, {Number: 2, Model: "flash", Start: now}}}
	record := func(replay int) []protocol.AttemptRecord {
		return []protocol.AttemptRecord{{Replay: replay, Epoch: epoch, Number: 1, Model: "flash", Class: string(gemini.Transient), At: now},
			{Replay: replay, Epoch: epoch, Number: 2, Model: "flash", At: now}}
	}
	add := func(r gemini.Result) func(*protocol.Task) any {
		return func(t *protocol.Task) any { return rules.AddSpend(t, epoch, r) }
	}
	run(t, []change{
		{name: "a call's spend is recorded once", before: running, apply: add(res), want: func(t *protocol.Task) {
			t.SpentBy = []string{"w1:4"}
			t.Usage, t.CostUSD, t.InDoubt, t.ModelCalls = res.Usage, 0.5, res.InDoubt, 2
			t.AttemptLog = record(1)
		}, answer: true},
		{name: "recorded already: nothing", before: func() *protocol.Task {
			t := running()
			t.SpentBy = []string{"w1:4"}
			return t
		}, apply: add(res), want: func(*protocol.Task) {}, answer: false},
		{name: "nothing spent: nothing", before: running, apply: add(gemini.Result{}), want: func(*protocol.Task) {}, answer: false},
		{name: "a zombie of an earlier replay charges that replay", before: func() *protocol.Task {
			t := running()
			t.Previous = []protocol.Generation{{Replay: 0, LastEpoch: epoch}}
			return t
		}, apply: add(res), want: func(t *protocol.Task) {
			t.SpentBy = []string{"w1:4"}
			t.Previous[0].Usage, t.Previous[0].CostUSD = res.Usage, 0.5
			t.InDoubt, t.ModelCalls = res.InDoubt, 2
			t.AttemptLog = record(0)
		}, answer: true},
	})
}

func TestClaimDelivery(t *testing.T) {
	t.Parallel()
	pending := func(lease claim.Lease, attempts int) func() *protocol.Task {
		return func() *protocol.Task {
			t := &protocol.Task{ID: "t1", State: task.StateSucceeded}
			t.Delivery = protocol.Delivery{State: task.DeliveryPending, EventID: "e1", NextAttemptAt: at(-time.Second),
				Attempts: attempts, Lease: lease}
			if attempts > 0 {
				t.Delivery.FirstAttemptAt = at(-time.Minute)
			}
			return t
		}
	}
	reservation := claim.Lease{Owner: protocol.NudgeOwner, Epoch: 2, ExpiresAt: at(time.Minute)}
	claimFor := func(reserved int64) func(*protocol.Task) any {
		return func(t *protocol.Task) any { return protocol.ClaimDelivery(t, "rh1", now, time.Minute, reserved) }
	}
	run(t, []change{
		{name: "a free delivery: its first attempt", before: pending(claim.Lease{Epoch: 1}, 0), apply: claimFor(0), want: func(t *protocol.Task) {
			t.Delivery.Lease = claim.Lease{Owner: "rh1", Epoch: 2, ExpiresAt: at(time.Minute)}
			t.Delivery.Attempts, t.Delivery.FirstAttemptAt = 1, at(0)
		}, answer: true},
		{name: "the nudge its reservation was for takes it over, the attempt counted once", before: pending(reservation, 1), apply: claimFor(2),
			want: func(t *protocol.Task) {
				t.Delivery.Lease = claim.Lease{Owner: "rh1", Epoch: 3, ExpiresAt: at(time.Minute)}
			}, answer: true},
		{name: "another nudge leaves the reservation alone", before: pending(reservation, 1), apply: claimFor(0),
			want: func(*protocol.Task) {}, answer: false},
		{name: "a delivery in its backoff waits", before: func() *protocol.Task {
			t := pending(claim.Lease{Epoch: 1}, 1)()
			t.Delivery.NextAttemptAt = at(time.Second)
			return t
		}, apply: claimFor(0), want: func(*protocol.Task) {}, answer: false},
	})
}

func TestJoinBatch(t *testing.T) {
	t.Parallel()
	waiting := func(notBefore time.Duration) func() *protocol.Task {
		return func() *protocol.Task {
			return &protocol.Task{ID: "t1", State: task.StateQueued, Mode: task.ModeBatch, BatchModel: "flash", Claims: 1,
				NotBefore: at(notBefore), Lease: claim.Lease{Epoch: 1}}
		}
	}
	join := func(model string) func(*protocol.Task) any {
		return func(t *protocol.Task) any { return protocol.JoinBatch(t, "j1", model, now, time.Hour) }
	}
	run(t, []change{
		{name: "a task waiting for the batch joins the job", before: waiting(time.Hour), apply: join("flash"), want: func(t *protocol.Task) {
			t.State, t.BatchJob, t.BatchModel, t.Claims = task.StateRunning, "j1", "", 0
			t.Lease = claim.Lease{Owner: protocol.BatchOwner("j1"), Epoch: 2, ExpiresAt: at(time.Hour)}
		}, answer: true},
		{name: "one waiting for another model stays", before: waiting(time.Hour), apply: join("pro"), want: func(*protocol.Task) {}, answer: false},
		{name: "one already due is a worker's", before: waiting(-time.Second), apply: join("flash"), want: func(*protocol.Task) {}, answer: false},
	})
}
