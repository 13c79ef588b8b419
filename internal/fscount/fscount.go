// Package fscount counts what a Firestore client costs: documents read, documents written and
// commits, observed at the gRPC layer, so benchmarks report operations per task without
// instrumenting the code they measure — in all, and per step of the path when the counter is
// told how to name the step of the goroutine that makes a call.
package fscount

import (
	"context"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/firestore/apiv1/firestorepb"
	"google.golang.org/grpc"

	"github.com/genbox-dev/genbox/internal/emulator"
)

// Counter counts the operations of every client opened through it. Safe for concurrent use.
// Set Step and OnWrite before opening a client.
type Counter struct {
	reads, writes, commits atomic.Int64

	// Step, when set, names the step an operation belongs to, called on the goroutine that makes
	// the call (so it may read that goroutine's stack); ByStep keeps the counts of each name.
	Step func() string
	// OnWrite, when set, is called after each successful write with its step ("" without Step),
	// the time it returned and the ids of the documents it wrote.
	OnWrite func(step string, at time.Time, docs []string)

	mu    sync.Mutex
	steps map[string]Counts
}

// Counts is a snapshot of a Counter.
type Counts struct {
	Reads   int64 // documents read: gets, batch gets and query results
	Writes  int64 // documents written: in commits, batch writes (BulkWriter) or single writes
	Commits int64 // commit calls (transactions and batched writes)
}

// Sub returns c − o.
func (c Counts) Sub(o Counts) Counts {
	return Counts{Reads: c.Reads - o.Reads, Writes: c.Writes - o.Writes, Commits: c.Commits - o.Commits}
}

// Counts returns the counts so far.
func (c *Counter) Counts() Counts {
	return Counts{Reads: c.reads.Load(), Writes: c.writes.Load(), Commits: c.commits.Load()}
}

// ByStep returns the counts so far of each step Step named; nil without Step.
func (c *Counter) ByStep() map[string]Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.steps == nil {
		return nil
	}
	out := make(map[string]Counts, len(c.steps))
	for k, v := range c.steps {
		out[k] = v
	}
	return out
}

// add counts reads, writes and commits, in all and for the calling goroutine's step, which it
// returns.
func (c *Counter) add(reads, writes, commits int64) string {
	c.reads.Add(reads)
	c.writes.Add(writes)
	c.commits.Add(commits)
	if c.Step == nil {
		return ""
	}
	step := c.Step()
	c.mu.Lock()
	if c.steps == nil {
		c.steps = map[string]Counts{}
	}
	n := c.steps[step]
	c.steps[step] = Counts{Reads: n.Reads + reads, Writes: n.Writes + writes, Commits: n.Commits + commits}
	c.mu.Unlock()
	return step
}

// EmulatorClient opens a client of project on the Firestore emulator at host whose operations c
// counts.
func (c *Counter) EmulatorClient(ctx context.Context, host, project string) (*firestore.Client, error) {
	return emulator.FirestoreClient(ctx, host, project, grpc.WithChainUnaryInterceptor(c.unary), grpc.WithChainStreamInterceptor(c.stream))
}

func (c *Counter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	var step string
	var docs []string
	switch r := req.(type) {
	case *firestorepb.CommitRequest:
		step, docs = c.add(0, int64(len(r.Writes)), 1), written(r.Writes)
	case *firestorepb.BatchWriteRequest:
		step, docs = c.add(0, int64(len(r.Writes)), 0), written(r.Writes)
	case *firestorepb.GetDocumentRequest:
		c.add(1, 0, 0)
	case *firestorepb.UpdateDocumentRequest:
		step, docs = c.add(0, 1, 0), []string{path.Base(r.GetDocument().GetName())}
	case *firestorepb.CreateDocumentRequest:
		step, docs = c.add(0, 1, 0), []string{r.GetDocumentId()}
	case *firestorepb.DeleteDocumentRequest:
		step, docs = c.add(0, 1, 0), []string{path.Base(r.GetName())}
	}
	if err == nil && len(docs) > 0 && c.OnWrite != nil {
		c.OnWrite(step, time.Now(), docs)
	}
	return err
}

// written returns the ids of the documents writes change.
func written(writes []*firestorepb.Write) []string {
	docs := make([]string, 0, len(writes))
	for _, w := range writes {
		name := w.GetUpdate().GetName()
		switch {
		case name != "":
		case w.GetDelete() != "":
			name = w.GetDelete()
		default:
			name = w.GetTransform().GetDocument()
		}
		docs = append(docs, path.Base(name))
	}
	return docs
}

func (c *Counter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	return &countingStream{ClientStream: s, c: c}, err
}

type countingStream struct {
	grpc.ClientStream
	c *Counter
}

func (s *countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		switch r := m.(type) {
		case *firestorepb.BatchGetDocumentsResponse:
			if r.GetFound() != nil || r.GetMissing() != "" {
				s.c.add(1, 0, 0)
			}
		case *firestorepb.RunQueryResponse:
			if r.GetDocument() != nil {
				s.c.add(1, 0, 0)
			}
		}
	}
	return err
}
