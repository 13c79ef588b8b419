// Package gcsfake serves Cloud Storage in-process for the dev stack and the tests: the
// fake-gcs-server emulator (github.com/fsouza/fake-gcs-server/fakestorage) on a loopback port,
// reached through the real storage client, with a throwaway key that signs upload URLs.
//
// The emulator accepts a signed URL without checking its signature, expiry or signed headers
// (content type, x-goog-content-length-range, x-goog-if-generation-match): what Cloud Storage
// enforces on such a PUT is not enforced here. genbox checks the object it finds against what
// the upload declared when a task names it, which the emulator does exercise.
package gcsfake

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/option"

	"github.com/genbox-dev/genbox/internal/objects"
)

// Server is a running emulator.
type Server struct {
	fake *fakestorage.Server
	host string
	key  []byte
}

// Start serves an emulator holding the given (empty) buckets.
func Start(buckets ...string) (*Server, error) {
	fake, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", PublicHost: "127.0.0.1", NoListener: false})
	if err != nil {
		return nil, fmt.Errorf("start the storage emulator: %w", err)
	}
	for _, b := range buckets {
		fake.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: b, VersioningEnabled: true})
	}
	u, err := url.Parse(fake.URL())
	if err != nil {
		fake.Stop()
		return nil, err
	}
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		fake.Stop()
		return nil, err
	}
	key := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
	return &Server{fake: fake, host: u.Host, key: key}, nil
}

// Host is the emulator's host:port, the value of STORAGE_EMULATOR_HOST that reaches it.
func (s *Server) Host() string { return s.host }

// Fake is the emulator itself, for tests that look behind the storage client.
func (s *Server) Fake() *fakestorage.Server { return s.fake }

// Client returns a storage client of the emulator whose upload URLs it serves.
func (s *Server) Client(ctx context.Context) (*objects.Client, error) {
	signer := objects.Signer{GoogleAccessID: "genbox-dev@genbox-dev.iam.gserviceaccount.com", PrivateKey: s.key, Hostname: s.host, Insecure: true}
	return objects.New(ctx, signer, option.WithEndpoint("http://"+s.host+"/storage/v1/"), option.WithoutAuthentication())
}

// Close stops the emulator.
func (s *Server) Close() { s.fake.Stop() }
