package emulator

import (
	"context"
	"fmt"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// FirestoreClient opens a client of project on the Firestore emulator at host whose connection
// takes opts (interceptors that count or fail calls). The client library ignores dial options
// when it dials an emulator itself, so the connection is made here, with the emulator's owner
// credentials.
func FirestoreClient(ctx context.Context, host, project string, opts ...grpc.DialOption) (*firestore.Client, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(ownerCreds{})}, opts...)
	conn, err := grpc.NewClient(host, opts...)
	if err != nil {
		return nil, fmt.Errorf("firestore emulator %s: %w", host, err)
	}
	fs, err := firestore.NewClient(ctx, project, option.WithGRPCConn(conn))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("firestore: %w", err)
	}
	return fs, nil
}

// ownerCreds is the emulator's owner token, as the firestore client sends it to an emulator.
type ownerCreds struct{}

func (ownerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer owner"}, nil
}
func (ownerCreds) RequireTransportSecurity() bool { return false }
