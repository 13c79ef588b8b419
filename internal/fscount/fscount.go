// Package fscount counts what a Firestore client costs: documents read, documents written and
// commits, observed at the gRPC layer, so benchmarks report operations per task without
// instrumenting the code they measure.
package fscount

import (
	"context"
	"sync/atomic"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/firestore/apiv1/firestorepb"
	"google.golang.org/grpc"

	"github.com/genbox-dev/genbox/internal/emulator"
)

// Counter counts the operations of every client opened through it. Safe for concurrent use.
type Counter struct {
	reads, writes, commits atomic.Int64
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

// EmulatorClient opens a client of project on the Firestore emulator at host whose operations c
// counts.
func (c *Counter) EmulatorClient(ctx context.Context, host, project string) (*firestore.Client, error) {
	return emulator.FirestoreClient(ctx, host, project, grpc.WithChainUnaryInterceptor(c.unary), grpc.WithChainStreamInterceptor(c.stream))
}

func (c *Counter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch r := req.(type) {
	case *firestorepb.CommitRequest:
		c.commits.Add(1)
		c.writes.Add(int64(len(r.Writes)))
	case *firestorepb.BatchWriteRequest:
		c.writes.Add(int64(len(r.Writes)))
	case *firestorepb.GetDocumentRequest:
		c.reads.Add(1)
	case *firestorepb.UpdateDocumentRequest, *firestorepb.CreateDocumentRequest, *firestorepb.DeleteDocumentRequest:
		c.writes.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
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
				s.c.reads.Add(1)
			}
		case *firestorepb.RunQueryResponse:
			if r.GetDocument() != nil {
				s.c.reads.Add(1)
			}
		}
	}
	return err
}
