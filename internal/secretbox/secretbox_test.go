package secretbox

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"hash/crc32"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func localBox(t *testing.T) *Box {
	t.Helper()
	key, err := NewLocalKey()
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := FromKey(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A sealed secret opens for its tenant under the key it was sealed with, and not for another
// tenant, under another key, or altered; the stored form holds no trace of the secret.
func TestSealOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := localBox(t)
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	s, err := b.Seal(ctx, "acme", secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Open(ctx, "acme", s); err != nil || got != secret {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if strings.Contains(string(s.Ciphertext)+string(s.WrappedKey), "MfKQ9r8G") {
		t.Fatal("the sealed form holds the secret")
	}
	if _, err := b.Open(ctx, "globex", s); err == nil {
		t.Error("a secret of acme opened as globex's")
	}
	if _, err := localBox(t).Open(ctx, "acme", s); err == nil {
		t.Error("opened under another local key")
	}
	tampered := s
	tampered.Ciphertext = append([]byte{}, s.Ciphertext...)
	tampered.Ciphertext[0] ^= 1
	if _, err := b.Open(ctx, "acme", tampered); err == nil {
		t.Error("an altered ciphertext opened")
	}
	other := s
	other.Key = "projects/p/locations/l/keyRings/r/cryptoKeys/k"
	if _, err := b.Open(ctx, "acme", other); !errors.Is(err, ErrOtherKey) {
		t.Errorf("sealed under another key: %v, want ErrOtherKey", err)
	}
}

func TestLocalKeyForm(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"", "local:", "local:c2hvcnQ=", "aGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8gd29y"} {
		if _, err := NewLocal(k); err == nil {
			t.Errorf("NewLocal(%q) accepted", k)
		}
	}
	for _, k := range []string{"projects/p/locations/global/keyRings/r/cryptoKeys/k", "local:" + strings.Repeat("A", 43) + "="} {
		if err := CheckKey(k); err != nil {
			t.Errorf("CheckKey(%q) = %v", k, err)
		}
	}
	if err := CheckKey("projects/p/keyRings/r"); err == nil {
		t.Error("CheckKey accepted a partial KMS name")
	}
}

// counting counts the unwraps of a Wrapper.
type counting struct {
	Wrapper
	unwraps atomic.Int64
}

func (c *counting) Unwrap(ctx context.Context, wrapped, aad []byte) ([]byte, error) {
	c.unwraps.Add(1)
	return c.Wrapper.Unwrap(ctx, wrapped, aad)
}

// Opening the same secret for every delivery unwraps its data key once per CacheTTL.
func TestDataKeysCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key, _ := NewLocalKey()
	l, _ := NewLocal(key)
	w := &counting{Wrapper: l}
	b := New(w)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.now = func() time.Time { return at }
	s, err := b.Seal(ctx, "acme", "whsec_x")
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := b.Open(ctx, "acme", s); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.unwraps.Load(); n != 1 {
		t.Fatalf("%d unwraps for 100 opens, want 1", n)
	}
	if _, err := b.Open(ctx, "globex", s); err == nil {
		t.Fatal("the cached key opened another tenant's document")
	}
	at = at.Add(CacheTTL + time.Second)
	if _, err := b.Open(ctx, "acme", s); err != nil {
		t.Fatal(err)
	}
	if n := w.unwraps.Load(); n != 3 {
		t.Fatalf("%d unwraps after the cache expired, want 3 (one refused for globex)", n)
	}
}

// fakeKMS speaks Cloud KMS's Encrypt and Decrypt over gRPC, as the service does: it checks
// the request checksums, binds a ciphertext to its additional authenticated data, and answers
// with the checksums and verification flags KMS sets.
type fakeKMS struct {
	kmspb.UnimplementedKeyManagementServiceServer
	key     string
	gcm     cipher.AEAD
	mu      sync.Mutex
	corrupt bool // answer with a wrong ciphertext checksum
}

func sum(b []byte) int64 { return int64(crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))) }

func (f *fakeKMS) Encrypt(_ context.Context, r *kmspb.EncryptRequest) (*kmspb.EncryptResponse, error) {
	if r.GetName() != f.key {
		return nil, status.Errorf(codes.NotFound, "no key %s", r.GetName())
	}
	if r.GetPlaintextCrc32C().GetValue() != sum(r.GetPlaintext()) || r.GetAdditionalAuthenticatedDataCrc32C().GetValue() != sum(r.GetAdditionalAuthenticatedData()) {
		return nil, status.Error(codes.InvalidArgument, "checksum mismatch")
	}
	nonce := make([]byte, f.gcm.NonceSize())
	_, _ = rand.Read(nonce)
	ct := f.gcm.Seal(nonce, nonce, r.GetPlaintext(), r.GetAdditionalAuthenticatedData())
	f.mu.Lock()
	defer f.mu.Unlock()
	ctSum := sum(ct)
	if f.corrupt {
		ctSum++
	}
	return &kmspb.EncryptResponse{Name: f.key + "/cryptoKeyVersions/1", Ciphertext: ct, CiphertextCrc32C: wrapperspb.Int64(ctSum),
		VerifiedPlaintextCrc32C: true, VerifiedAdditionalAuthenticatedDataCrc32C: true}, nil
}

func (f *fakeKMS) Decrypt(_ context.Context, r *kmspb.DecryptRequest) (*kmspb.DecryptResponse, error) {
	if r.GetName() != f.key {
		return nil, status.Errorf(codes.NotFound, "no key %s", r.GetName())
	}
	if r.GetCiphertextCrc32C().GetValue() != sum(r.GetCiphertext()) {
		return nil, status.Error(codes.InvalidArgument, "checksum mismatch")
	}
	n := f.gcm.NonceSize()
	if len(r.GetCiphertext()) < n {
		return nil, status.Error(codes.InvalidArgument, "short ciphertext")
	}
	pt, err := f.gcm.Open(nil, r.GetCiphertext()[:n], r.GetCiphertext()[n:], r.GetAdditionalAuthenticatedData())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "decryption failed")
	}
	return &kmspb.DecryptResponse{Plaintext: pt, PlaintextCrc32C: wrapperspb.Int64(sum(pt))}, nil
}

// serveKMS starts a fake KMS holding key and returns client options reaching it.
func serveKMS(t *testing.T, key string) (*fakeKMS, []option.ClientOption) {
	t.Helper()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	block, _ := aes.NewCipher(raw)
	gcm, _ := cipher.NewGCM(block)
	f := &fakeKMS{key: key, gcm: gcm}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	kmspb.RegisterKeyManagementServiceServer(srv, f)
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return f, []option.ClientOption{option.WithEndpoint(ln.Addr().String()), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}
}

// Through the real KMS client: what one service seals with the key another opens, bound to the
// tenant; a corrupted answer is an error.
func TestKMSWrapper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const key = "projects/p/locations/global/keyRings/genbox/cryptoKeys/webhook-secrets"
	f, opts := serveKMS(t, key)
	publisher, closePub, err := FromKey(ctx, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closePub() }()
	resulthandler, closeRH, err := FromKey(ctx, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeRH() }()
	s, err := publisher.Seal(ctx, "acme", "whsec_kms")
	if err != nil {
		t.Fatal(err)
	}
	if s.Key != key {
		t.Errorf("sealed under %q, want %q", s.Key, key)
	}
	if got, err := resulthandler.Open(ctx, "acme", s); err != nil || got != "whsec_kms" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if _, err := resulthandler.Open(ctx, "globex", s); err == nil {
		t.Error("opened as another tenant's")
	}
	f.mu.Lock()
	f.corrupt = true
	f.mu.Unlock()
	if _, err := publisher.Seal(ctx, "acme", "whsec_kms"); !errors.Is(err, errIntegrity) {
		t.Errorf("a corrupted answer: %v, want the integrity error", err)
	}
	if _, _, err := FromKey(ctx, "projects/p/keyRings/r", opts...); err == nil {
		t.Error("FromKey accepted a partial KMS name")
	}
}
