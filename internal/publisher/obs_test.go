package publisher

import (
	"context"
	"sync"
	"testing"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/internal/testenv"
)

// Not parallel: it installs global telemetry. A submitted task counts as queued by family, a
// cancelled one as cancelled; the nudge's publish carries the task id.
//
//nolint:paralleltest // it installs global telemetry
func TestSubmitAndCancelAreCounted(t *testing.T) {
	tel := obstest.Install(t)
	var mu sync.Mutex
	var ids []string // the task id of each nudge's context
	e := setup(t, func(_ *Config, d *Deps) {
		d.Metrics = tel.Metrics
		d.Publisher.(*testenv.Publisher).SetPublishFunc(func(ctx context.Context, topic string, _ []byte, _ map[string]string) error {
			if topic == bus.TopicTasks {
				mu.Lock()
				ids = append(ids, obs.TaskID(ctx))
				mu.Unlock()
			}
			return nil
		})
	})
	a := e.submit(validRequest())
	e.submit(validRequest())
	if _, err := e.api.Cancel(context.Background(), a.TaskID); err != nil {
		t.Fatal(err)
	}
	for state, want := range map[string]float64{"queued": 2, "cancelled": 1} {
		if got := tel.Sum(t, obs.MetricTasks, "state="+state, "family=summarize"); got != want {
			t.Errorf("%s{state=%s,family=summarize} = %g, want %g", obs.MetricTasks, state, got, want)
		}
	}
	if got := tel.Sum(t, obs.MetricTaskE2ELatency, "state=cancelled"); got != 1 {
		t.Errorf("%s{state=cancelled} count = %g, want 1", obs.MetricTaskE2ELatency, got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 2 || ids[0] != a.TaskID {
		t.Errorf("nudge contexts carried task ids %v, want the submitted tasks'", ids)
	}
}
