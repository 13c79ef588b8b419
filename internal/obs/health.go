package obs

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Check is one dependency of a service's readiness: Probe returns nil when it is usable.
type Check struct {
	Name  string
	Probe func(ctx context.Context) error
}

// Readiness is the body of a readiness answer.
type Readiness struct {
	Status string            `json:"status"`           // "ok" or "unavailable"
	Failed map[string]string `json:"failed,omitempty"` // check name -> FailedTimeout or FailedError
}

// What a failed check says in a readiness answer: the probe's own error (an address, a
// project, a library's message) goes to the log only, as /readyz is public.
const (
	FailedTimeout = "timed out"
	FailedError   = "failed"
)

// Ready returns the readiness handler (GET /readyz): every check runs at once, each bounded by
// timeout; 200 when all pass, else 503 naming the failed checks and logging why on log.
// Liveness (/healthz) stays a plain 200: a process whose dependency is down should not be
// restarted for it.
func Ready(log *slog.Logger, timeout time.Duration, checks ...Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		var mu sync.Mutex
		var wg sync.WaitGroup
		ans := Readiness{Status: "ok"}
		for _, c := range checks {
			wg.Go(func() {
				if err := c.Probe(ctx); err != nil {
					log.WarnContext(ctx, "readiness check failed", "check", c.Name, "error", err)
					why := FailedError
					if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
						why = FailedTimeout
					}
					mu.Lock()
					defer mu.Unlock()
					if ans.Failed == nil {
						ans.Failed = map[string]string{}
					}
					ans.Failed[c.Name] = why
				}
			})
		}
		wg.Wait()
		code := http.StatusOK
		if len(ans.Failed) > 0 {
			ans.Status, code = "unavailable", http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(ans)
	})
}

// Live is the liveness handler (GET /healthz): a plain 200 {"status":"ok"} while the process
// serves.
func Live() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(Readiness{Status: "ok"})
	})
}

// Running is a readiness check of a long-running part (a pull consumer): Set(true) while it
// runs, Set(false) once it stops or the service shuts down.
type Running struct {
	mu  sync.Mutex
	on  bool
	why string
}

// Set records whether the part runs; why says what stopped it.
func (r *Running) Set(on bool, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on, r.why = on, why
}

// Check returns the readiness check of the part, named name.
func (r *Running) Check(name string) Check {
	return Check{Name: name, Probe: func(context.Context) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.on {
			return errNotRunning(r.why)
		}
		return nil
	}}
}

type errNotRunning string

func (e errNotRunning) Error() string {
	if e == "" {
		return "not running"
	}
	return "not running: " + string(e)
}
