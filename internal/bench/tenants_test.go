package bench

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseTenants(t *testing.T) {
	t.Parallel()
	got, err := ParseTenants("bulk:tasks=1000:cap=10:weight=3, small:tasks=10:cap=10:after=5s:alone,vip:urgent=2s")
	if err != nil {
		t.Fatal(err)
	}
	want := []TenantLoad{
		{Name: "bulk", Tasks: 1000, Cap: 10, Weight: 3},
		{Name: "small", Tasks: 10, Cap: 10, After: 5 * time.Second, Alone: true},
		{Name: "vip", Tasks: 1, Urgent: 2 * time.Second},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("tenant %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"a:tasks=0", "a:cap=-1", "a:weight=-1", "a:colour=red", "a,a", ":tasks=3", "a:after=soon"} {
		if _, err := ParseTenants(bad); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--tenants") {
			t.Errorf("%q: error %v, want one naming --tenants", bad, err)
		}
	}
}

// Two tenants, each capped, on two worker instances: every task of each is generated and
// delivered once, the fake never holds more of a tenant's calls than its cap, and the report
// has a row per tenant with its ratio to the bound.
func TestRunTenants(t *testing.T) {
	t.Parallel()
	cfg := small(t)
	cfg.Baseline, cfg.Instances = BaselineNone, 2
	cfg.Tenants = []TenantLoad{{Name: "bulk", Tasks: 24, Cap: 3, Urgent: 300 * time.Millisecond}, {Name: "late", Tasks: 4, Cap: 2, After: 200 * time.Millisecond}}
	cfg.Concurrency, cfg.Latency, cfg.Distribution = 4, 100*time.Millisecond, DistFixed
	cfg.ModelErrors, cfg.ResultLoss, cfg.AckLoss, cfg.WebhookErrors = 0, 0, 0, 0
	rep, out := runLogged(t, cfg)
	r := rep.Tenants
	if r == nil || len(r.Tenants) != 2 {
		t.Fatalf("report %+v, want two tenants", r)
	}
	if g := r.Run; g.Lost != 0 || g.BilledRatio() != 1 || g.Duplicates != 0 {
		t.Errorf("lost %d, billed ratio %.3f, %d duplicates; want every task generated and delivered once", g.Lost, g.BilledRatio(), g.Duplicates)
	}
	for _, tr := range r.Tenants {
		want := tr.Tasks
		if tr.Urgent > 0 {
			want++
		}
		if tr.Completed != want || tr.PeakCalls > tr.Cap || tr.Ratio() <= 0 {
			t.Errorf("%s: %d of %d completed, %d calls at once (cap %d), ratio %.3f", tr.Name, tr.Completed, want, tr.PeakCalls, tr.Cap, tr.Ratio())
		}
		if !strings.Contains(out, "\n"+tr.Name+" ") {
			t.Errorf("report lacks a row for %s:\n%s", tr.Name, out)
		}
	}
}

// The shares of a run are measured from the calls the fake held: two tenants holding 3 and 1
// calls, from the light one's first call until the heavy one's last starts, after which the
// light one holds all four.
func TestMeasureShares(t *testing.T) {
	t.Parallel()
	cfg := Config{Concurrency: 4, Latency: time.Second,
		Tenants: []TenantLoad{{Name: "heavy", Tasks: 30, Weight: 3}, {Name: "light", Tasks: 20}}}
	c := newTenantCalls()
	start := time.Unix(1000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	call := func(tenant string, from float64) {
		c.spans[tenant] = append(c.spans[tenant], span{start: at(from), end: at(from + 1)})
	}
	for s := 0.0; s < 10; s++ {
		for range 3 {
			call("heavy", s)
		}
		if s >= 1 { // its nudges came after the heavy one's
			call("light", s)
		}
	}
	for range 4 {
		call("light", 10.5)
	}
	sh, ok := measureShares(cfg, c, start)
	if !ok {
		t.Fatal("no shares measured")
	}
	want := Shares{From: time.Second + shareSettle, To: 8 * time.Second, First: "heavy",
		Of: map[string]float64{"heavy": 0.75, "light": 0.25}, Want: map[string]float64{"heavy": 0.75, "light": 0.25},
		Takeover: map[string]time.Duration{"light": 1500 * time.Millisecond}}
	if d := cmp.Diff(want, sh); d != "" {
		t.Errorf("shares (-want +got):\n%s", d)
	}
}
