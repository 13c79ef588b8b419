package secretbox

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"regexp"
	"strings"

	kms "cloud.google.com/go/kms/apiv1"
	"cloud.google.com/go/kms/apiv1/kmspb"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// KMS is a key-encryption key in Cloud KMS: wrapping is an Encrypt call (the publisher's
// account holds roles/cloudkms.cryptoKeyEncrypter on the key), unwrapping a Decrypt call (the
// resulthandler's, roles/cloudkms.cryptoKeyDecrypter). Both check the CRC32C checksums KMS
// returns, so a corrupted request or answer is an error, not a wrong key.
type KMS struct {
	c   *kms.KeyManagementClient
	key string
}

var _ Wrapper = (*KMS)(nil)

// cryptoKey matches a CryptoKey resource name; its primary version encrypts, and the version a
// ciphertext names decrypts, so rotating the key needs no re-sealing.
var cryptoKey = regexp.MustCompile(`^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$`)

// NewKMS returns the KMS wrapper of key, a CryptoKey name
// (projects/P/locations/L/keyRings/R/cryptoKeys/K). Close releases its connection.
func NewKMS(ctx context.Context, key string, opts ...option.ClientOption) (*KMS, error) {
	if !cryptoKey.MatchString(key) {
		return nil, fmt.Errorf("secretbox: %q is not a KMS key name (projects/P/locations/L/keyRings/R/cryptoKeys/K)", key)
	}
	c, err := kms.NewKeyManagementClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("secretbox: kms client: %w", err)
	}
	return &KMS{c: c, key: key}, nil
}

// Close releases the client's connection.
func (k *KMS) Close() error { return k.c.Close() }

// Key implements Wrapper.
func (k *KMS) Key() string { return k.key }

func crc(b []byte) *wrapperspb.Int64Value {
	return wrapperspb.Int64(int64(crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))))
}

// errIntegrity means KMS's answer did not match the checksums of the request or itself.
var errIntegrity = errors.New("secretbox: kms: checksum mismatch in transit")

// Wrap implements Wrapper.
func (k *KMS) Wrap(ctx context.Context, dek, aad []byte) ([]byte, error) {
	resp, err := k.c.Encrypt(ctx, &kmspb.EncryptRequest{Name: k.key, Plaintext: dek, PlaintextCrc32C: crc(dek),
		AdditionalAuthenticatedData: aad, AdditionalAuthenticatedDataCrc32C: crc(aad)})
	if err != nil {
		return nil, fmt.Errorf("kms encrypt: %w", err)
	}
	if !resp.GetVerifiedPlaintextCrc32C() || !resp.GetVerifiedAdditionalAuthenticatedDataCrc32C() ||
		resp.GetCiphertextCrc32C().GetValue() != crc(resp.GetCiphertext()).GetValue() || !strings.HasPrefix(resp.GetName(), k.key+"/") {
		return nil, errIntegrity
	}
	return resp.GetCiphertext(), nil
}

// Unwrap implements Wrapper.
func (k *KMS) Unwrap(ctx context.Context, wrapped, aad []byte) ([]byte, error) {
	resp, err := k.c.Decrypt(ctx, &kmspb.DecryptRequest{Name: k.key, Ciphertext: wrapped, CiphertextCrc32C: crc(wrapped),
		AdditionalAuthenticatedData: aad, AdditionalAuthenticatedDataCrc32C: crc(aad)})
	if err != nil {
		return nil, fmt.Errorf("kms decrypt: %w", err)
	}
	if resp.GetPlaintextCrc32C().GetValue() != crc(resp.GetPlaintext()).GetValue() {
		return nil, errIntegrity
	}
	return resp.GetPlaintext(), nil
}

// EnvKey names the key the publisher seals, and the resulthandler opens, webhook secrets with:
// a KMS CryptoKey name, or a local key (local use only).
const EnvKey = "GENBOX_WEBHOOK_SECRETS_KEY"

// FromKey returns the Box of key — a KMS CryptoKey name, or a local key ("local:<base64>") —
// and a function releasing what it holds.
func FromKey(ctx context.Context, key string, opts ...option.ClientOption) (*Box, func() error, error) {
	if strings.HasPrefix(key, LocalPrefix) {
		l, err := NewLocal(key)
		if err != nil {
			return nil, nil, err
		}
		return New(l), func() error { return nil }, nil
	}
	k, err := NewKMS(ctx, key, opts...)
	if err != nil {
		return nil, nil, err
	}
	return New(k), k.Close, nil
}

// CheckKey reports whether key has one of the two forms FromKey accepts, without connecting.
func CheckKey(key string) error {
	if strings.HasPrefix(key, LocalPrefix) {
		_, err := NewLocal(key)
		return err
	}
	if !cryptoKey.MatchString(key) {
		return fmt.Errorf("%q is neither a KMS key name (projects/P/locations/L/keyRings/R/cryptoKeys/K) nor local:<base64 of 32 bytes>", key)
	}
	return nil
}
