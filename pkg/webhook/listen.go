package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// MaxBodyBytes bounds the body a Receiver reads; genbox payloads stay well under Firestore's
// 1 MiB document limit.
const MaxBodyBytes = 2 << 20

// listenerIDs bounds the webhook ids a Receiver counts: the least recently seen are forgotten
// first, so a long-running listener's memory stays bounded.
const listenerIDs = 10_000

// Receiver returns an http.Handler that verifies every POSTed delivery with v and prints it to
// out: one line naming it (and, for a webhook-id seen before, which delivery of it this is: what
// a receiver must dedupe), then its body. A verified delivery is answered 204, a failed one 401
// (printed with the reason), so the sender's retries can be watched. It is what
// `genbox webhook listen` serves. It counts the deliveries of the last 10,000 ids.
func Receiver(v *Verifier, out io.Writer) http.Handler {
	var mu sync.Mutex // deliveries arrive concurrently; keep each one's lines together
	seen := newLRU[int](listenerIDs)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		if err != nil {
			http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		verr := v.Verify(body, r.Header)
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(body, &ev) // the type is only printed; an unparsable body shows as such
		mu.Lock()
		if verr != nil {
			fmt.Fprintf(out, "REJECTED webhook-id=%q: %v\n", r.Header.Get(HeaderID), verr)
		} else {
			id := r.Header.Get(HeaderID)
			n, _ := seen.get(id, time.Time{})
			n++
			seen.put(id, n, time.Time{})
			dup := ""
			if n > 1 {
				dup = fmt.Sprintf(" duplicate=%d", n)
			}
			fmt.Fprintf(out, "verified webhook-id=%s type=%s timestamp=%s%s\n%s\n",
				id, ev.Type, r.Header.Get(HeaderTimestamp), dup, body)
		}
		mu.Unlock()
		if verr != nil {
			http.Error(w, "signature verification failed", http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// ListenAndPrint serves a Receiver on addr until ctx ends, printing deliveries to out. With an
// empty secret it generates one and prints it, to be set as the tenant's webhook secret. It
// prints the address it listens on first (useful with port 0).
func ListenAndPrint(ctx context.Context, addr, secret string, out io.Writer) error {
	if secret == "" {
		s, err := NewSecret()
		if err != nil {
			return err
		}
		secret = s
		fmt.Fprintf(out, "no secret given; generated %s\n", secret)
	}
	v, err := NewVerifier(secret)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("webhook listen: %w", err)
	}
	fmt.Fprintf(out, "listening on http://%s\n", ln.Addr())
	// A listener is often reachable from outside (a tunnel to a laptop): no client may hold it.
	srv := &http.Server{Handler: Receiver(v, out), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("webhook listen: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("webhook listen: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("webhook listen: %w", err)
	}
	return nil
}
