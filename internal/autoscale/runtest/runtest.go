// Package runtest is a fake of the Cloud Run Admin API's worker pools, in-process: it serves
// the RunWorkerPools gRPC service for one pool scaled manually, and starts and stops instances
// as the pool's count changes, through functions the test gives it (a worker run in-process). As
// Cloud Run does, it picks which instances a lower count stops, and stops them after answering.
// It records every instance's life, so a test can tell what the pool would have been billed.
package runtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"cloud.google.com/go/run/apiv2/runpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Start starts an instance named id and returns the function that stops it (as SIGTERM does:
// it returns once the instance has exited).
type Start func(id string) (stop func())

// Life is one instance's life: from its start to the end of its stop (zero while it runs).
type Life struct {
	ID          string
	Start, Stop time.Time
}

// Server is the fake. Its zero value is not usable: call New.
type Server struct {
	runpb.UnimplementedWorkerPoolsServer

	start Start

	mu      sync.Mutex
	pool    *runpb.WorkerPool
	running map[string]func() // by instance id: its stop
	lives   []Life
	next    int
	updates int
	stops   sync.WaitGroup
}

// New returns a fake serving the worker pool name at zero instances.
func New(name string, start Start) *Server {
	return &Server{start: start, running: map[string]func(){},
		pool: &runpb.WorkerPool{Name: name, Etag: "0", Scaling: &runpb.WorkerPoolScaling{ManualInstanceCount: proto.Int32(0)}}}
}

// Serve serves the fake on a loopback port and returns its address (for
// GENBOX_RUN_ADMIN_EMULATOR_HOST) and the function that stops it and every instance.
func (s *Server) Serve() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	g := grpc.NewServer()
	runpb.RegisterWorkerPoolsServer(g, s)
	go func() { _ = g.Serve(ln) }()
	return ln.Addr().String(), func() {
		g.Stop()
		s.reconcile(0)
		s.stops.Wait()
	}, nil
}

// GetWorkerPool returns the pool.
func (s *Server) GetWorkerPool(_ context.Context, req *runpb.GetWorkerPoolRequest) (*runpb.WorkerPool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.GetName() != s.pool.GetName() {
		return nil, status.Errorf(codes.NotFound, "worker pool %q not found", req.GetName())
	}
	return proto.Clone(s.pool).(*runpb.WorkerPool), nil
}

// UpdateWorkerPool takes only a new manual instance count (the update mask must say so), and
// refuses a stale etag. The operation it returns is done; instances start and stop after.
func (s *Server) UpdateWorkerPool(_ context.Context, req *runpb.UpdateWorkerPoolRequest) (*longrunningpb.Operation, error) {
	wp := req.GetWorkerPool()
	if paths := req.GetUpdateMask().GetPaths(); len(paths) != 1 || paths[0] != "scaling.manual_instance_count" {
		return nil, status.Errorf(codes.InvalidArgument, "update mask %v: this fake changes the instance count only", paths)
	}
	n := wp.GetScaling().GetManualInstanceCount()
	if n < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "manual_instance_count %d", n)
	}
	s.mu.Lock()
	if wp.GetName() != s.pool.GetName() {
		s.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "worker pool %q not found", wp.GetName())
	}
	if wp.GetEtag() != "" && wp.GetEtag() != s.pool.GetEtag() {
		s.mu.Unlock()
		return nil, status.Errorf(codes.Aborted, "etag %q is stale", wp.GetEtag())
	}
	s.updates++
	s.pool.Scaling.ManualInstanceCount = proto.Int32(n)
	s.pool.Etag = fmt.Sprint(s.updates)
	out := proto.Clone(s.pool).(*runpb.WorkerPool)
	s.mu.Unlock()
	s.reconcile(int(n))
	res, err := anypb.New(out)
	if err != nil {
		return nil, err
	}
	return &longrunningpb.Operation{Name: wp.GetName() + "/operations/" + out.GetEtag(), Done: true,
		Result: &longrunningpb.Operation_Response{Response: res}}, nil
}

// reconcile starts or stops instances until n run; it stops instances picked at random, each in
// its own goroutine.
func (s *Server) reconcile(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.running) < n {
		s.next++
		id := fmt.Sprintf("instance-%d", s.next)
		s.lives = append(s.lives, Life{ID: id, Start: time.Now()})
		s.running[id] = s.start(id)
	}
	for len(s.running) > n {
		ids := make([]string, 0, len(s.running))
		for id := range s.running {
			ids = append(ids, id)
		}
		id := ids[rand.IntN(len(ids))]
		stop := s.running[id]
		delete(s.running, id)
		s.stops.Go(func() {
			stop()
			s.mu.Lock()
			defer s.mu.Unlock()
			for i := range s.lives {
				if s.lives[i].ID == id {
					s.lives[i].Stop = time.Now()
				}
			}
		})
	}
}

// Instances returns the pool's manual instance count.
func (s *Server) Instances() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.pool.GetScaling().GetManualInstanceCount())
}

// Running returns how many instances run now (started, and not yet told to stop).
func (s *Server) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// Lives returns every instance's life so far, in the order they started.
func (s *Server) Lives() []Life {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Life(nil), s.lives...)
}

// Updates returns how many updates changed the pool.
func (s *Server) Updates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updates
}
