package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

func TestLogBufferAddr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, lines, message, want string
	}{
		{"none yet", `{"message":"starting"}`, "svc started", ""},
		{"started", `{"message":"svc started","addr":"[::]:4321"}`, "svc started", "[::]:4321"},
		{"another service", `{"message":"other started","addr":"[::]:1"}`, "svc started", ""},
		{"first of two", "{\"message\":\"svc started\",\"addr\":\"[::]:1\"}\n{\"message\":\"svc started\",\"addr\":\"[::]:2\"}", "svc started", "[::]:1"},
		{"not JSON", `svc started addr=[::]:1`, "svc started", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b testenv.LogBuffer
			_, _ = io.WriteString(&b, tt.lines+"\n")
			if got := b.Addr(tt.message); got != tt.want {
				t.Errorf("Addr(%q) = %q, want %q", tt.message, got, tt.want)
			}
		})
	}
}

func TestServiceStarted(t *testing.T) {
	t.Parallel()
	stopped := errors.New("stopped")
	var read string
	svc := testenv.Start(t, func(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
		read = getenv("NAME")
		log := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.MessageKey {
				a.Key = "message"
			}
			return a
		}}))
		log.InfoContext(ctx, "svc started", "addr", "[::]:4321")
		<-ctx.Done()
		return stopped
	}, map[string]string{"NAME": "svc"})
	if got := svc.Started(t, "svc", 10*time.Second); got != "http://127.0.0.1:4321" {
		t.Errorf("Started = %q", got)
	}
	if err := svc.Stop(); !errors.Is(err, stopped) || read != "svc" {
		t.Errorf("Stop = %v, run read NAME=%q; want run's own error, having read svc", err, read)
	}
	if err := svc.Stop(); !errors.Is(err, stopped) {
		t.Errorf("Stop again = %v, want the same error", err)
	}
}

func TestPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var p testenv.Publisher
	for i := range 3 {
		if _, err := p.Publish(ctx, []string{"a", "b", "a"}[i], []byte(fmt.Sprint(i)), map[string]string{"n": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if on := p.On("a"); len(on) != 2 || string(on[0].Data) != "0" || on[1].Attrs["n"] != "2" {
		t.Errorf("On(a) = %+v", on)
	}
	boom := errors.New("down")
	p.SetPublishFunc(func(_ context.Context, topic string, _ []byte, _ map[string]string) error {
		if topic == "b" {
			return boom
		}
		return nil
	})
	if _, err := p.Publish(ctx, "b", nil, nil); !errors.Is(err, boom) {
		t.Errorf("Publish = %v, want the PublishFunc's error", err)
	}
	if _, err := p.Publish(ctx, "c", nil, nil); err != nil {
		t.Fatal(err)
	}
	if all := p.All(); len(all) != 4 || all[3].Topic != "c" {
		t.Errorf("All = %+v, want the failed publish left out", all)
	}
	if took, left := p.Take(), p.All(); len(took) != 4 || len(left) != 0 {
		t.Errorf("Take = %d then %d left", len(took), len(left))
	}
}

func TestBus(t *testing.T) {
	t.Parallel()
	ps := testenv.Bus(t, emulator.ProjectID(t), bus.DefaultTopology())
	pub := bus.NewPublisher(ps)
	defer pub.Close()
	if _, err := pub.Publish(t.Context(), bus.TopicTasks, []byte("x"), nil); err != nil {
		t.Fatalf("publish on a bootstrapped topic: %v", err)
	}
	fs := testenv.Firestore(t, emulator.ProjectID(t))
	if _, err := fs.Collection("c").Doc("d").Set(t.Context(), map[string]any{"a": 1}); err != nil {
		t.Fatalf("write on the emulator: %v", err)
	}
}

func TestBusAt(t *testing.T) {
	t.Parallel()
	ps := testenv.BusAt(t, emulator.ProjectID(t), os.Getenv(emulator.PubSubHostEnv), bus.DefaultTopology())
	pub := bus.NewPublisher(ps)
	defer pub.Close()
	if _, err := pub.Publish(t.Context(), bus.TopicTasks, []byte("x"), nil); err != nil {
		t.Fatalf("publish on a topic bootstrapped at the named host: %v", err)
	}
}

// Tenant creates the tenant with a webhook secret of its own, the one it returns.
func TestTenant(t *testing.T) {
	t.Parallel()
	st := store.New(testenv.Firestore(t, emulator.ProjectID(t)))
	secret := testenv.Tenant(t, st, "acme")
	if got, err := st.WebhookSecrets(t.Context(), "acme"); err != nil || !slices.Contains(got, secret) {
		t.Fatalf("tenant secrets %q (%v), want %q among them", got, err, secret)
	}
}

func TestClock(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	c := testenv.NewClock(at)
	c.Add(time.Minute)
	if got := c.Now(); !got.Equal(at.Add(time.Minute)) {
		t.Errorf("after Add: %s", got)
	}
	c.Set(at)
	if got := c.Now(); !got.Equal(at) {
		t.Errorf("after Set: %s", got)
	}
}
