package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The fallback drill sends one small request per family to each fallback model alone — never
// the primary — and reports every answer in one alert; a broken fallback shows as such. Only one
// instance drills per interval.
func TestFallbackDrill(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_MODEL_CHAIN": "primary,fallback-a,fallback-b", "GENBOX_MODEL_ATTEMPTS": "1"})
	reg, err := prompts.Load("")
	if err != nil {
		t.Fatal(err)
	}
	b.srv.Outage("fallback-b", time.Hour)
	d := &Drill{Store: b.store, Models: b.gen, Catalog: reg, Pub: b.pub, Log: b.log, Every: time.Hour}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	waitFor(t, "the drill's report", 30*time.Second, func() bool { return len(b.pub.On(bus.TopicAlerts)) > 0 })
	stop()
	<-done

	families := reg.Families()
	led := b.srv.Ledger()
	if n := led.Model("primary").Calls; n != 0 {
		t.Errorf("the drill called the primary %d times, want never", n)
	}
	if n := led.Model("fallback-a").Generations; n != len(families) {
		t.Errorf("fallback-a answered %d drill requests, want one per family (%d)", n, len(families))
	}
	alerts := b.pub.On(bus.TopicAlerts)
	if len(alerts) != 1 || !strings.HasPrefix(alerts[0].Attrs[task.AttrAlert], "fallback-drill:") {
		t.Fatalf("alerts %+v, want one drill report", alerts)
	}
	report := string(alerts[0].Data)
	for _, f := range families {
		// fallback-b fails every call; after enough of them its breaker opens, and the rest find it unavailable.
		failing := strings.Contains(report, f+" on fallback-b: transient") || strings.Contains(report, f+" on fallback-b: unavailable")
		if !strings.Contains(report, f+" on fallback-a: ok") || !failing {
			t.Errorf("the report does not show %s answered by fallback-a and failing on fallback-b:\n%s", f, report)
		}
	}

	// Another instance within the interval does not drill again.
	other := &Drill{Store: b.store, Models: b.gen, Catalog: reg, Pub: b.pub, Log: b.log, Every: time.Hour}
	if due, err := other.claim(context.Background()); err != nil || due {
		t.Errorf("a second instance's claim within the interval: %v %v, want not due", due, err)
	}
}
