package service_test

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/service"
)

// limited is a server of NewServer under short limits, on a loopback port.
func limited(t *testing.T, h http.Handler, l service.Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := service.NewServer(h, l)
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// closedWithin reports whether the server closes c (a read ends with EOF or a reset) before
// the generous bound; a read timeout means the connection was still held open.
func closedWithin(t *testing.T, c net.Conn, bound time.Duration) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(bound))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return false
	}
	return true
}

// A client cannot hold a server with a slow body, an unread answer, an idle connection or a
// huge header block; a streaming server still answers slowly.
func TestServerLimits(t *testing.T) {
	t.Parallel()
	const short = 200 * time.Millisecond
	const bound = 10 * time.Second // far above short: the test asserts behaviour, not speed
	l := service.Limits{ReadTimeout: short, WriteTimeout: short, IdleTimeout: short, MaxHeaderBytes: 4 << 10}
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(5 * short) // past the write timeout
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "done")
	})
	addr := limited(t, slow, l)

	t.Run("header block over MaxHeaderBytes", func(t *testing.T) {
		t.Parallel()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		req.Header.Set("X-Pad", strings.Repeat("h", 64<<10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", resp.StatusCode)
		}
	})
	t.Run("body dribbled past ReadTimeout", func(t *testing.T) {
		t.Parallel()
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
		if !closedWithin(t, c, bound) {
			t.Fatalf("a request whose body never came was held open %v", bound)
		}
	})
	t.Run("answer past WriteTimeout", func(t *testing.T) {
		t.Parallel()
		resp, err := http.Get("http://" + addr + "/slow")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("a handler slower than WriteTimeout was answered: %d %q", resp.StatusCode, b)
		}
	})
	t.Run("idle connection past IdleTimeout", func(t *testing.T) {
		t.Parallel()
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !closedWithin(t, c, bound) {
			t.Fatalf("an idle keep-alive connection was held open %v", bound)
		}
	})
	t.Run("streaming server has no WriteTimeout", func(t *testing.T) {
		t.Parallel()
		s := l
		s.Streaming = true
		resp, err := http.Get("http://" + limited(t, slow, s) + "/slow")
		if err != nil {
			t.Fatalf("a streaming server cut a slow answer off: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "done" {
			t.Fatalf("answer %q", b)
		}
	})
}

func TestDefaultLimitsAreSet(t *testing.T) {
	t.Parallel()
	srv := service.NewServer(http.NewServeMux(), service.Limits{})
	d := service.DefaultLimits()
	if srv.ReadHeaderTimeout != d.ReadHeaderTimeout || srv.ReadTimeout != d.ReadTimeout || srv.WriteTimeout != d.WriteTimeout ||
		srv.IdleTimeout != d.IdleTimeout || srv.MaxHeaderBytes != d.MaxHeaderBytes {
		t.Fatalf("server %+v, want the defaults %+v", srv, d)
	}
	for name, v := range map[string]time.Duration{"ReadHeaderTimeout": d.ReadHeaderTimeout, "ReadTimeout": d.ReadTimeout,
		"WriteTimeout": d.WriteTimeout, "IdleTimeout": d.IdleTimeout} {
		if v <= 0 {
			t.Errorf("default %s is %v", name, v)
		}
	}
	if d.MaxHeaderBytes <= 0 || d.MaxHeaderBytes >= http.DefaultMaxHeaderBytes {
		t.Errorf("default MaxHeaderBytes %d, want below net/http's %d", d.MaxHeaderBytes, http.DefaultMaxHeaderBytes)
	}
}

// Every http.Server the module builds outside tests is bounded: made by NewServer, or (in the
// public packages and the fake Gemini, which do not import internal/service) a literal setting
// all five limits.
func TestEveryServerIsBounded(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	need := []string{"ReadHeaderTimeout", "ReadTimeout", "WriteTimeout", "IdleTimeout", "MaxHeaderBytes"}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Server" {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "http" {
				return true
			}
			set := map[string]bool{}
			for _, el := range lit.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if k, ok := kv.Key.(*ast.Ident); ok {
						set[k.Name] = true
					}
				}
			}
			for _, k := range need {
				if !set[k] {
					t.Errorf("%s: an http.Server without %s: build it with service.NewServer", fset.Position(lit.Pos()), k)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
