// Package objects is genbox's one Cloud Storage access layer: it reads the attributes and the
// bytes of the objects tasks name — always at the generation recorded when the task was
// submitted — signs the URLs that upload one object each, and deletes genbox's own uploads.
package objects

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/option"
)

// Environment variables.
const (
	// EnvInputBucket names the deployment's input bucket: where POST /v1/uploads writes.
	EnvInputBucket = "GENBOX_INPUT_BUCKET"
	// EnvEmulatorHost points the storage client at an emulator (read by the client itself).
	EnvEmulatorHost = "STORAGE_EMULATOR_HOST"
)

// Sentinel errors.
var (
	// ErrNotFound means the object (or the generation asked for) does not exist.
	ErrNotFound = errors.New("objects: no such object")
	// ErrBadURI means a file URI is not gs://bucket/object.
	ErrBadURI = errors.New("objects: not a gs://bucket/object URI")
)

// Attrs are what genbox records of an object when a task names it.
type Attrs struct {
	Bucket, Object string
	Generation     int64
	Size           int64
	CRC32C         uint32
	MD5            []byte
	ContentType    string
}

// Signer says how upload URLs are signed. Empty (production): by the service's own account
// through the IAM Credentials API (the account needs roles/iam.serviceAccountTokenCreator on
// itself). GoogleAccessID and PrivateKey sign locally (the dev stack's throwaway key);
// Hostname and Insecure point the URL at an emulator.
type Signer struct {
	GoogleAccessID string
	PrivateKey     []byte
	Hostname       string
	Insecure       bool
}

// Client is a Cloud Storage client. It is safe for concurrent use.
type Client struct {
	c      *storage.Client
	signer Signer
}

// New returns a Client. Without options it is the real storage client of the environment: an
// emulator when STORAGE_EMULATOR_HOST names one, Cloud Storage with the default credentials
// otherwise.
func New(ctx context.Context, signer Signer, opts ...option.ClientOption) (*Client, error) {
	c, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("storage client: %w", err)
	}
	return &Client{c: c, signer: signer}, nil
}

// Close closes the client.
func (c *Client) Close() error { return c.c.Close() }

var bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$`)

// ParseURI splits gs://bucket/object.
func ParseURI(uri string) (bucket, object string, err error) {
	rest, ok := strings.CutPrefix(uri, "gs://")
	if !ok {
		return "", "", ErrBadURI
	}
	bucket, object, ok = strings.Cut(rest, "/")
	if !ok || object == "" || !bucketRE.MatchString(bucket) || len(object) > 1024 {
		return "", "", ErrBadURI
	}
	return bucket, object, nil
}

// URI is gs://bucket/object.
func URI(bucket, object string) string { return "gs://" + bucket + "/" + object }

// Attrs reads the current attributes of bucket/object.
func (c *Client) Attrs(ctx context.Context, bucket, object string) (Attrs, error) {
	a, err := c.c.Bucket(bucket).Object(object).Attrs(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) || errors.Is(err, storage.ErrBucketNotExist) {
		return Attrs{}, fmt.Errorf("%s: %w", URI(bucket, object), ErrNotFound)
	}
	if err != nil {
		return Attrs{}, fmt.Errorf("attributes of %s: %w", URI(bucket, object), err)
	}
	return Attrs{Bucket: bucket, Object: object, Generation: a.Generation, Size: a.Size, CRC32C: a.CRC32C,
		MD5: a.MD5, ContentType: a.ContentType}, nil
}

// Open reads the bytes of generation of bucket/object: a later write of the object does not
// change what it reads (ErrNotFound once that generation is gone). The client checks the
// bytes against the object's CRC32C.
func (c *Client) Open(ctx context.Context, bucket, object string, generation int64) (io.ReadCloser, error) {
	r, err := c.c.Bucket(bucket).Object(object).Generation(generation).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil, fmt.Errorf("%s#%d: %w", URI(bucket, object), generation, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s#%d: %w", URI(bucket, object), generation, err)
	}
	return r, nil
}

// Delete deletes bucket/object; one already gone is not an error.
func (c *Client) Delete(ctx context.Context, bucket, object string) error {
	err := c.c.Bucket(bucket).Object(object).Delete(ctx)
	if err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("delete %s: %w", URI(bucket, object), err)
	}
	return nil
}

// Headers of a signed upload, fixed in its signature: the content type, the size range and
// the precondition that the object does not exist yet.
const (
	HeaderContentType   = "Content-Type"
	HeaderLengthRange   = "x-goog-content-length-range"
	HeaderIfGenerationM = "x-goog-if-generation-match"
)

// SignPut returns a V4 signed URL that PUTs bucket/object once, until expires: the request must
// carry the returned headers, which the signature covers — its content type, a size of at most
// size bytes, and if-generation-match 0, so that the URL can create the object but never
// overwrite it.
func (c *Client) SignPut(bucket, object, mimeType string, size int64, expires time.Time) (string, map[string]string, error) {
	headers := map[string]string{
		HeaderContentType:   mimeType,
		HeaderLengthRange:   "0," + strconv.FormatInt(size, 10),
		HeaderIfGenerationM: "0",
	}
	opts := &storage.SignedURLOptions{
		Method:         http.MethodPut,
		Expires:        expires,
		Scheme:         storage.SigningSchemeV4,
		ContentType:    mimeType,
		Headers:        []string{HeaderLengthRange + ":" + headers[HeaderLengthRange], HeaderIfGenerationM + ":0"},
		GoogleAccessID: c.signer.GoogleAccessID,
		PrivateKey:     c.signer.PrivateKey,
		Hostname:       c.signer.Hostname,
		Insecure:       c.signer.Insecure,
	}
	u, err := c.c.Bucket(bucket).SignedURL(object, opts)
	if err != nil {
		return "", nil, fmt.Errorf("sign the upload of %s: %w", URI(bucket, object), err)
	}
	return u, headers, nil
}
