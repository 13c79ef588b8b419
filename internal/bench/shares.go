package bench

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/fairshare"
)

// shareSettle is left out of the contended period's start: the worker divides the pool once a
// second, and a tenant admitted before the first division comes down to its share as its runs
// end.
const shareSettle = 2 * time.Second

// span is one call the fake held.
type span struct{ start, end time.Time }

// spans returns tenant's calls as the fake held them.
func (c *tenantCalls) spansOf(tenant string) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans[tenant])
}

// callSeconds is how long tenant's calls ran within [from, to), in seconds summed over calls.
func (c *tenantCalls) callSeconds(tenant string, from, to time.Time) float64 {
	sum := 0.0
	for _, s := range c.spansOf(tenant) {
		a, b := maxTime(s.start, from), minTime(s.end, to)
		if b.After(a) {
			sum += b.Sub(a).Seconds()
		}
	}
	return sum
}

// reaches returns the first time at or after from when tenant held n calls at once, and
// whether it ever did.
func (c *tenantCalls) reaches(tenant string, from time.Time, n int) (time.Time, bool) {
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, s := range c.spansOf(tenant) {
		edges = append(edges, edge{s.start, +1}, edge{s.end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // an end before a start at the same instant
	})
	held := 0
	for _, e := range edges {
		held += e.d
		if held >= n && !e.at.Before(from) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// firstStart is when tenant's first call started.
func (c *tenantCalls) firstStart(tenant string) time.Time {
	var first time.Time
	for _, s := range c.spansOf(tenant) {
		if first.IsZero() || s.start.Before(first) {
			first = s.start
		}
	}
	return first
}

// lastStart is when tenant's last call started.
func (c *tenantCalls) lastStart(tenant string) time.Time {
	var last time.Time
	for _, s := range c.spansOf(tenant) {
		last = maxTime(last, s.start)
	}
	return last
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Shares is how a multi-tenant run's backlogs divided the pool's slots while they all had tasks
// to run: from shareSettle after every one of them had a call until the first of them to end
// started its last call, less one model latency (its backlog ended then).
type Shares struct {
	From, To time.Duration // the contended period, from the drain's start
	// First is the tenant whose backlog ended first.
	First string
	// Of holds, by tenant, its part of the calls' time in the period, and the part the fair-share
	// rule gives it (fairshare.Allot over the backlogs).
	Of, Want map[string]float64
	// Takeover is, by tenant, how long after First's backlog ended (its last call started) it
	// first held every slot it may; absent when it never did.
	Takeover map[string]time.Duration
}

// measureShares measures the shares of a run whose tenants all queued a backlog at the drain's
// start; ok is false when the run had fewer than two such tenants or no contended period.
func measureShares(cfg Config, calls *tenantCalls, start time.Time) (Shares, bool) {
	var backlogs []TenantLoad
	for _, t := range cfg.Tenants {
		if t.After == 0 {
			backlogs = append(backlogs, t)
		}
	}
	if len(backlogs) < 2 {
		return Shares{}, false
	}
	sh := Shares{Of: map[string]float64{}, Want: map[string]float64{}, Takeover: map[string]time.Duration{}}
	var end time.Time
	for _, t := range backlogs {
		if last := calls.lastStart(t.Name); end.IsZero() || last.Before(end) {
			end, sh.First = last, t.Name
		}
	}
	// The period starts once every backlog has had a call (their tasks' submissions and nudges
	// come one tenant after the other) and the shares have settled.
	var began time.Time
	for _, t := range backlogs {
		began = maxTime(began, calls.firstStart(t.Name))
	}
	from, to := maxTime(began, start).Add(shareSettle), end.Add(-cfg.Latency)
	if !to.After(from) {
		return Shares{}, false
	}
	sh.From, sh.To = from.Sub(start), to.Sub(start)
	slots := cfg.Concurrency * max(cfg.Instances, 1)
	var ft []fairshare.Tenant
	total := 0.0
	for _, t := range backlogs {
		sh.Of[t.Name] = calls.callSeconds(t.Name, from, to)
		total += sh.Of[t.Name]
		ft = append(ft, fairshare.Tenant{ID: t.Name, Weight: t.Weight, Cap: t.Cap, Waiting: t.Tasks})
	}
	allot := fairshare.Allot(slots, ft)
	given := 0
	for _, t := range backlogs {
		given += allot[t.Name].Slots
	}
	for _, t := range backlogs {
		if total > 0 {
			sh.Of[t.Name] /= total
		}
		sh.Want[t.Name] = float64(allot[t.Name].Slots) / float64(max(given, 1))
		if t.Name == sh.First {
			continue
		}
		if at, ok := calls.reaches(t.Name, end, min(slots, capOr(t.Cap, slots))); ok {
			sh.Takeover[t.Name] = at.Sub(end)
		}
	}
	return sh, true
}

func capOr(c, none int) int {
	if c > 0 {
		return c
	}
	return none
}

// print writes the shares under the tenants' table.
func (sh Shares) print(w io.Writer, tenants []TenantLoad) {
	fmt.Fprintf(w, "\nslot shares while every backlog had tasks to run (%s to %s after the drain's start):", dur(sh.From), dur(sh.To))
	for _, t := range tenants {
		if _, ok := sh.Of[t.Name]; !ok {
			continue
		}
		fmt.Fprintf(w, " %s %.1f %% (weight %d: %.1f %%, ÷ %.3f)", t.Name, 100*sh.Of[t.Name], max(t.Weight, 1), 100*sh.Want[t.Name], sh.Of[t.Name]/sh.Want[t.Name])
	}
	fmt.Fprintln(w)
	for _, t := range tenants {
		if _, ok := sh.Of[t.Name]; !ok || t.Name == sh.First {
			continue
		}
		if d, ok := sh.Takeover[t.Name]; ok {
			fmt.Fprintf(w, "%s held every slot it may %s after %s's backlog ended\n", t.Name, dur(d), sh.First)
		} else {
			fmt.Fprintf(w, "%s never held every slot it may after %s's backlog ended\n", t.Name, sh.First)
		}
	}
}
