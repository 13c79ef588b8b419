package testenv

import (
	"context"
	"net"
	"sync"
	"testing"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Stall is a TCP proxy in front of a server (the shared Firestore emulator) that can stop
// forwarding: while it holds, no byte passes either way and every connection stays open, as
// when a store stalls without failing. The server itself is never touched, so the other tests
// on it go on.
type Stall struct {
	target string
	ln     net.Listener

	mu    sync.Mutex
	open  chan struct{} // closed while bytes flow; a fresh one while held
	conns []net.Conn
}

// NewStall listens on a free loopback port and forwards each connection to target, until t ends.
func NewStall(t testing.TB, target string) *Stall {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Stall{target: target, ln: ln, open: make(chan struct{})}
	close(s.open)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.accept()
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		s.Release()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			_ = c.Close()
		}
	})
	return s
}

// Addr is the proxy's host:port.
func (s *Stall) Addr() string { return s.ln.Addr().String() }

// Hold stops every byte, on open connections and new ones alike, until Release.
func (s *Stall) Hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.open:
		s.open = make(chan struct{})
	default:
	}
}

// Release forwards again, the bytes held first.
func (s *Stall) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.open:
	default:
		close(s.open)
	}
}

func (s *Stall) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", s.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		s.mu.Lock()
		s.conns = append(s.conns, c, up)
		s.mu.Unlock()
		go s.pipe(up, c)
		go s.pipe(c, up)
	}
}

// pipe copies src to dst, each chunk only once the proxy is not holding; when either side ends,
// the connection ends both ways.
func (s *Stall) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			s.mu.Lock()
			open := s.open
			s.mu.Unlock()
			<-open
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// FirestoreAt returns a client of project on the Firestore emulator at host (a Stall's Addr)
// instead of the environment's, with the emulator's owner credentials, closed when t ends.
func FirestoreAt(t testing.TB, project, host string) *firestore.Client {
	t.Helper()
	conn, err := grpc.NewClient(host, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(emulatorOwner{}))
	if err != nil {
		t.Fatal(err)
	}
	fs, err := firestore.NewClient(context.Background(), project, option.WithGRPCConn(conn))
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fs.Close()
		_ = conn.Close()
	})
	return fs
}

// emulatorOwner authorizes every call as the emulator's admin ("Bearer owner"), as the client
// library does itself for FIRESTORE_EMULATOR_HOST.
type emulatorOwner struct{}

func (emulatorOwner) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer owner"}, nil
}

func (emulatorOwner) RequireTransportSecurity() bool { return false }
