package sweeper

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Not parallel: it installs global telemetry. The leader reports the age of the oldest pending
// task and the open dead letters by stage, as Firestore has them.
//
//nolint:paralleltest // it installs global telemetry
func TestLeaderReportsBacklogGauges(t *testing.T) {
	tel := obstest.Install(t)
	s, pub := setup(t)
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s.Now = func() time.Time { return now.Add(-90 * time.Second) }
	create(t, s, "old", func(*protocol.Task) {})
	s.Now = func() time.Time { return now.Add(-10 * time.Second) }
	create(t, s, "young", func(*protocol.Task) {})
	s.Now = func() time.Time { return now }
	if _, err := s.DeadLetters().Doc("dl").Create(context.Background(),
		&store.DeadLetter{TaskID: "x", Stage: task.StageDelivery, State: store.DeadLetterOpen, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sw := New(s, pub, nil, slog.New(slog.DiscardHandler), testConfig(), "w1", WithMetrics(tel.Metrics))
	done := make(chan struct{})
	go func() { defer close(done); _ = sw.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(20 * time.Second)
	for len(tel.Points(t, obs.MetricPendingAge)) == 0 || len(tel.Points(t, obs.MetricDeadLettersOpen)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no pending age reported")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := tel.Sum(t, obs.MetricPendingAge); got != 90 {
		t.Errorf("%s = %g, want 90 (the oldest task's wait)", obs.MetricPendingAge, got)
	}
	if got := tel.Sum(t, obs.MetricDeadLettersOpen, "stage=delivery"); got != 1 {
		t.Errorf("%s{stage=delivery} = %g, want 1", obs.MetricDeadLettersOpen, got)
	}
	if got := tel.Sum(t, obs.MetricDeadLettersOpen, "stage=generation"); got != 0 {
		t.Errorf("%s{stage=generation} = %g, want 0", obs.MetricDeadLettersOpen, got)
	}
	cancel()
	<-done
	if p := tel.Points(t, obs.MetricPendingAge); len(p) != 0 {
		t.Errorf("a stopped sweeper still reports %v", p)
	}
}
