package geminitest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	"google.golang.org/genai"
)

// Server is a Fake listening on a loopback port, for tests.
type Server struct {
	*Fake
	// URL is the base URL to give the client (genai.HTTPOptions.BaseURL).
	URL string
	ts  *httptest.Server
}

// NewServer starts a Fake on a loopback port; Close it when done.
func NewServer(opts ...Option) *Server {
	f := New(opts...)
	ts := httptest.NewServer(f)
	return &Server{Fake: f, URL: ts.URL, ts: ts}
}

// ClientConfig is a genai client configuration that talks to this server with the Gemini API
// backend and a placeholder key, SDK retries off.
func (s *Server) ClientConfig() *genai.ClientConfig {
	return &genai.ClientConfig{
		APIKey:      "fake-key",
		Backend:     genai.BackendGeminiAPI,
		HTTPOptions: genai.HTTPOptions{BaseURL: s.URL},
	}
}

// Close ends held and in-flight generations, then the HTTP server.
func (s *Server) Close() {
	s.Fake.Close()
	s.ts.Close()
}

// shutdownBudget bounds how long Serve waits for open connections when its context ends.
const shutdownBudget = 5 * time.Second

// Serve runs a Fake built from opts on addr (e.g. "127.0.0.1:8090"; ":0" picks a free port) until
// ctx ends, then shuts down and returns nil. It logs the address it bound, and every call, to
// log. A client reaches it with GOOGLE_GEMINI_BASE_URL=http://<addr> (or HTTPOptions.BaseURL)
// and any non-empty API key. This is what `genbox fakegemini --addr` runs.
func Serve(ctx context.Context, addr string, log *slog.Logger, opts ...Option) error {
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("fake gemini: listen on %s: %w", addr, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := New(append([]Option{WithLogger(log)}, opts...)...)
	// No WriteTimeout: the fake streams answers and plays generations as slow as configured.
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: 0,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	log.InfoContext(ctx, "fake gemini listening", "addr", ln.Addr().String(), "base_url", "http://"+ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		f.Close()
		return fmt.Errorf("fake gemini: serve: %w", err)
	case <-ctx.Done():
	}
	f.Close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownBudget)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("fake gemini: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("fake gemini: serve: %w", err)
	}
	return nil
}
