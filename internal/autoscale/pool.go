package autoscale

import (
	"context"
	"errors"
	"fmt"

	run "cloud.google.com/go/run/apiv2"
	"cloud.google.com/go/run/apiv2/runpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// Pool is the worker pool's instance count, as the Cloud Run Admin API sets it.
type Pool interface {
	Instances(ctx context.Context) (int, error)
	// SetInstances sets the count to n.
	SetInstances(ctx context.Context, n int) error
	// Raise sets the count to n only if it is lower, and returns the count: a wake never
	// shrinks a pool.
	Raise(ctx context.Context, n int) (int, error)
}

var _ Pool = (*CloudRun)(nil)

// CloudRun is a worker pool scaled manually through the Cloud Run Admin API: it needs
// run.workerpools.get and run.workerpools.update on the pool, and nothing else.
type CloudRun struct {
	c    *run.WorkerPoolsClient
	name string
}

// OpenCloudRun opens the Admin API client of cfg's pool: Google's endpoint with the service's
// credentials, or cfg.AdminEmulator without either.
func OpenCloudRun(ctx context.Context, cfg Config) (*CloudRun, error) {
	var opts []option.ClientOption
	if cfg.AdminEmulator != "" {
		opts = append(opts, option.WithEndpoint(cfg.AdminEmulator), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	c, err := run.NewWorkerPoolsClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("cloud run admin client: %w", err)
	}
	return &CloudRun{c: c, name: cfg.Pool}, nil
}

// Close releases the client's connection.
func (p *CloudRun) Close() error { return p.c.Close() }

// Instances returns the pool's manual instance count.
func (p *CloudRun) Instances(ctx context.Context) (int, error) {
	wp, err := p.c.GetWorkerPool(ctx, &runpb.GetWorkerPoolRequest{Name: p.name})
	if err != nil {
		return 0, fmt.Errorf("get worker pool %s: %w", p.name, err)
	}
	return int(wp.GetScaling().GetManualInstanceCount()), nil
}

// SetInstances sets the pool's manual instance count to n. It sends the pool as read back (its
// etag makes the update fail rather than undo a concurrent change: it is read and tried again)
// with the one field masked, and does not wait for the operation: a count change makes no
// revision, and Cloud Run starts or stops instances on its own time — the members' documents say
// when they did.
func (p *CloudRun) SetInstances(ctx context.Context, n int) error {
	return p.update(ctx, n, func(cur int32) bool { return cur != int32(n) })
}

// Raise sets the pool's count to n if it is lower, as SetInstances does, and returns the count.
func (p *CloudRun) Raise(ctx context.Context, n int) (int, error) {
	now := n
	err := p.update(ctx, n, func(cur int32) bool { now = max(n, int(cur)); return cur < int32(n) })
	return now, err
}

// update sets the count to n if change says so of the count read, reading again after a
// concurrent change (a stale etag).
func (p *CloudRun) update(ctx context.Context, n int, change func(cur int32) bool) error {
	var err error
	for range 3 {
		if err = p.set(ctx, n, change); status.Code(errors.Unwrap(err)) != codes.Aborted && status.Code(errors.Unwrap(err)) != codes.FailedPrecondition {
			return err
		}
	}
	return err
}

func (p *CloudRun) set(ctx context.Context, n int, change func(cur int32) bool) error {
	wp, err := p.c.GetWorkerPool(ctx, &runpb.GetWorkerPoolRequest{Name: p.name})
	if err != nil {
		return fmt.Errorf("get worker pool %s: %w", p.name, err)
	}
	if !change(wp.GetScaling().GetManualInstanceCount()) {
		return nil
	}
	if wp.Scaling == nil {
		wp.Scaling = &runpb.WorkerPoolScaling{}
	}
	wp.Scaling.ManualInstanceCount = proto.Int32(int32(n))
	_, err = p.c.UpdateWorkerPool(ctx, &runpb.UpdateWorkerPoolRequest{
		WorkerPool: wp, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"scaling.manual_instance_count"}},
	})
	if err != nil {
		return fmt.Errorf("scale worker pool %s to %d: %w", p.name, n, err)
	}
	return nil
}
