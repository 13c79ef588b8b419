package fairshare_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/fairshare"
)

func TestAllot(t *testing.T) {
	t.Parallel()
	backlog := func(id string, weight, cap int) fairshare.Tenant {
		return fairshare.Tenant{ID: id, Weight: weight, Cap: cap, Running: 10, Waiting: 1000}
	}
	for _, tc := range []struct {
		name    string
		pool    int
		tenants []fairshare.Tenant
		want    map[string]int // Slots
		limited []string
	}{
		{name: "fits: every tenant keeps its own cap", pool: 64,
			tenants: []fairshare.Tenant{{ID: "bulk", Cap: 10, Running: 10, Waiting: 990}, {ID: "small", Cap: 10, Running: 2}},
			want:    map[string]int{"bulk": 10, "small": 10}},
		{name: "weights 3 and 1 share 32 slots 24 and 8", pool: 32,
			tenants: []fairshare.Tenant{backlog("heavy", 3, 100), backlog("light", 1, 100)},
			want:    map[string]int{"heavy": 24, "light": 8}, limited: []string{"heavy", "light"}},
		{name: "weight 0 counts as 1", pool: 32,
			tenants: []fairshare.Tenant{backlog("a", 0, 100), backlog("b", 1, 100)},
			want:    map[string]int{"a": 16, "b": 16}, limited: []string{"a", "b"}},
		{name: "a tenant asking less than its share keeps it, the rest goes by weight", pool: 32,
			tenants: []fairshare.Tenant{{ID: "heavy", Weight: 3, Cap: 100, Running: 4}, backlog("light", 1, 100), backlog("mid", 2, 100)},
			want: map[string]int{
				"heavy": 16,            // asks 4; may grow to its part of the pool, 3/6 of 32
				"light": 9, "mid": 19}, // 28 left by weight: 9.33 and 18.67
			limited: []string{"light", "mid"}},
		{name: "an idle tenant's share goes to the others", pool: 32,
			tenants: []fairshare.Tenant{{ID: "heavy", Weight: 3, Cap: 100}, backlog("light", 1, 100)},
			want:    map[string]int{"heavy": 24, "light": 32}, limited: []string{"light"}},
		{name: "a cap below the share holds, the rest goes to the others", pool: 32,
			tenants: []fairshare.Tenant{backlog("heavy", 3, 5), backlog("light", 1, 100)},
			want:    map[string]int{"heavy": 5, "light": 27}, limited: []string{"light"}},
		{name: "rounding gives the pool whole, by largest remainder", pool: 10,
			tenants: []fairshare.Tenant{backlog("a", 1, 100), backlog("b", 1, 100), backlog("c", 1, 100)},
			want:    map[string]int{"a": 4, "b": 3, "c": 3}, limited: []string{"a", "b", "c"}},
		{name: "a pool smaller than the tenants gives each one slot at least", pool: 2,
			tenants: []fairshare.Tenant{backlog("a", 1, 100), backlog("b", 1, 100), backlog("c", 1, 100)},
			want:    map[string]int{"a": 1, "b": 1, "c": 1}, limited: []string{"a", "b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := fairshare.Allot(tc.pool, tc.tenants)
			slots := map[string]int{}
			var limited []string
			for _, tn := range tc.tenants {
				slots[tn.ID] = got[tn.ID].Slots
				if got[tn.ID].Limited {
					limited = append(limited, tn.ID)
				}
			}
			if d := cmp.Diff(tc.want, slots); d != "" {
				t.Errorf("slots (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.limited, limited); d != "" {
				t.Errorf("limited tenants (-want +got):\n%s", d)
			}
		})
	}
}
