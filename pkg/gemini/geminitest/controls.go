package geminitest

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Latency is how long a generation takes. The zero value answers at once. It is drawn only for
// a call that generates: one the Responder fails is answered at once, without a draw.
type Latency struct {
	// Min and Max bound a uniform draw; Max <= Min means exactly Min.
	Min, Max time.Duration
	// Func, when set, decides instead of Min and Max: it is called once per generation, so it
	// may count the calls in flight.
	Func func(r Request) time.Duration
}

// Fixed is a latency of exactly d.
func Fixed(d time.Duration) Latency { return Latency{Min: d} }

// Uniform is a latency drawn uniformly from [lo, hi].
func Uniform(lo, hi time.Duration) Latency { return Latency{Min: lo, Max: hi} }

// draw picks the latency of r; it calls Func without holding mu, so Func may use the Fake.
func (l Latency) draw(r Request, mu *sync.Mutex, rng *rand.Rand) time.Duration {
	switch {
	case l.Func != nil:
		return max(0, l.Func(r))
	case l.Max > l.Min:
		mu.Lock()
		defer mu.Unlock()
		return l.Min + time.Duration(rng.Int64N(int64(l.Max-l.Min)+1))
	}
	return max(0, l.Min)
}

// Limits are a model's rate limits, enforced with 429 RESOURCE_EXHAUSTED and a RetryInfo delay
// saying when the window will have room. countTokens calls never count.
type Limits struct {
	// RPM is the generation calls admitted per window; 0 means no limit.
	RPM int
	// TPM is the prompt tokens admitted per window (Gemini's input-token quota); 0 means no limit.
	TPM int64
	// Window is the sliding window; 0 means one minute. Tests use milliseconds.
	Window time.Duration
}

func (l Limits) window() time.Duration {
	if l.Window <= 0 {
		return time.Minute
	}
	return l.Window
}

// admitted is one call inside a model's rate window.
type admitted struct {
	at     time.Time
	tokens int64
}

// check admits a call of n prompt tokens at now, or returns how long until the window would have
// room for it and which quota refused it.
func (l Limits) check(win []admitted, n int64, now time.Time) (kept []admitted, wait time.Duration, quota string) {
	w := l.window()
	i := 0
	for i < len(win) && !win[i].at.After(now.Add(-w)) {
		i++
	}
	win = win[i:]
	if l.RPM > 0 && len(win) >= l.RPM {
		return win, win[len(win)-l.RPM].at.Add(w).Sub(now), "generate_content_requests_per_minute"
	}
	if l.TPM > 0 {
		var sum int64
		for _, a := range win {
			sum += a.tokens
		}
		if sum+n > l.TPM {
			if n > l.TPM {
				return win, w, "generate_content_input_tokens_per_minute"
			}
			for _, a := range win {
				sum -= a.tokens
				if sum+n <= l.TPM {
					return win, a.at.Add(w).Sub(now), "generate_content_input_tokens_per_minute"
				}
			}
		}
	}
	return append(win, admitted{at: now, tokens: n}), 0, ""
}

// Gate holds the generation calls of a model until released, e.g. to crash a worker while its
// call is in flight. A held call is still generating: it is billed when it finishes after Release,
// whether or not its client is still there.
type Gate struct {
	fake     *Fake
	model    string
	entered  chan Request
	released chan struct{}
	once     sync.Once
}

// Entered receives each call that reached the gate (buffered; calls beyond the buffer are not
// reported but are held all the same).
func (g *Gate) Entered() <-chan Request { return g.entered }

// Release lets every held call, and every later one, go on; it removes the gate. It is idempotent.
func (g *Gate) Release() {
	g.once.Do(func() {
		g.fake.mu.Lock()
		if g.fake.gates[g.model] == g {
			delete(g.fake.gates, g.model)
		}
		g.fake.mu.Unlock()
		close(g.released)
	})
}
