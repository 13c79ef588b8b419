// Package client is the Go client of genbox's REST API. The shapes it sends and returns are
// pkg/task's, the same types the server encodes.
//
// A submission carries an Idempotency-Key generated per call and reused on every retry, so a
// flaky network never makes two tasks of one intent. Network errors, 5xx and 429 answers are
// retried with exponential backoff and full jitter, honoring Retry-After. Every non-2xx answer
// is returned as a *task.Problem.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/pkg/backoff"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Client calls one genbox publisher with one key: an API key for the task routes, the admin key
// for the admin routes. It is safe for concurrent use.
type Client struct {
	base       string
	key        string
	hc         *http.Client
	retries    int
	retryDelay backoff.Policy // full jitter: the ceiling of retry n is min·2^(n-1), capped
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (http.DefaultClient otherwise).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithRetries sets how many times a failed call is retried (4 by default; 0 disables retries).
func WithRetries(n int) Option { return func(c *Client) { c.retries = n } }

// WithBackoff sets the bounds of the retry backoff (200 ms .. 10 s by default).
func WithBackoff(minDelay, maxDelay time.Duration) Option {
	return func(c *Client) { c.retryDelay.Base, c.retryDelay.Max = minDelay, maxDelay }
}

// New returns a client of the publisher at baseURL (e.g. "https://genbox.example.com").
func New(baseURL, key string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), key: key, hc: http.DefaultClient,
		retries: 4, retryDelay: backoff.Policy{Base: 200 * time.Millisecond, Max: 10 * time.Second, Jitter: backoff.Full}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// NewIdempotencyKey returns a random key for one intent.
func NewIdempotencyKey() string {
	var b [18]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Submit submits one task under a fresh idempotency key, reused by every retry of this call.
func (c *Client) Submit(ctx context.Context, req task.Request) (*task.SubmitResponse, error) {
	return c.SubmitWithKey(ctx, NewIdempotencyKey(), req)
}

// SubmitWithKey submits one task under key: calling it again with the same key and request
// returns the same task (Replayed set); with a different request it fails with a 422 Problem.
func (c *Client) SubmitWithKey(ctx context.Context, key string, req task.Request) (*task.SubmitResponse, error) {
	var out task.SubmitResponse
	h, err := c.do(ctx, http.MethodPost, "/v1/tasks", key, req, &out)
	if err != nil {
		return nil, err
	}
	out.Replayed = h.Get(task.HeaderReplayed) == "true"
	return &out, nil
}

// SubmitBatch submits up to task.MaxBatch tasks at once under a fresh idempotency key (each
// request gets its own key derived from it, so a retried batch makes no new tasks). Requests are
// accepted or refused one by one: check each result's Status.
func (c *Client) SubmitBatch(ctx context.Context, reqs []task.Request) (*task.BatchResponse, error) {
	var out task.BatchResponse
	if _, err := c.do(ctx, http.MethodPost, "/v1/tasks:batch", NewIdempotencyKey(), task.BatchRequest{Tasks: reqs}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Get returns a task as the API shows it.
func (c *Client) Get(ctx context.Context, id string) (*task.View, error) {
	var out task.View
	if _, err := c.do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(id), "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Wait polls a task every interval until it is finished or ctx ends.
func (c *Client) Wait(ctx context.Context, id string, interval time.Duration) (*task.View, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		v, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if v.State.Finished() {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("wait for task %s: %w", id, ctx.Err())
		case <-t.C:
		}
	}
}

// ListOptions select a page of tasks.
type ListOptions struct {
	State     task.State // empty: every state
	Limit     int        // 0: the server's default
	PageToken string     // empty: the first page
}

// List returns one page of the tenant's tasks, newest first.
func (c *Client) List(ctx context.Context, o ListOptions) (*task.List, error) {
	q := url.Values{}
	if o.State != "" {
		q.Set("state", string(o.State))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.PageToken != "" {
		q.Set("page_token", o.PageToken)
	}
	path := "/v1/tasks"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out task.List
	if _, err := c.do(ctx, http.MethodGet, path, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// All iterates over every task matching o, page by page; it stops at the first error.
func (c *Client) All(ctx context.Context, o ListOptions) iter.Seq2[task.View, error] {
	return func(yield func(task.View, error) bool) {
		for {
			page, err := c.List(ctx, o)
			if err != nil {
				yield(task.View{}, err)
				return
			}
			for _, v := range page.Tasks {
				if !yield(v, nil) {
					return
				}
			}
			if page.NextPageToken == "" {
				return
			}
			o.PageToken = page.NextPageToken
		}
	}
}

// Cancel cancels a scheduled, queued or waiting task and returns it; a running or finished task is a 409
// Problem. A retried cancel whose first attempt succeeded also answers 409.
func (c *Client) Cancel(ctx context.Context, id string) (*task.View, error) {
	var out task.View
	if _, err := c.do(ctx, http.MethodPost, "/v1/tasks/"+url.PathEscape(id)+":cancel", "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Delete erases a finished task's input and output, its uploads and Files API copies,
// discarding its dead webhook delivery if any (a 409 Problem for an unfinished or dead task);
// its accounting stays.
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/v1/tasks/"+url.PathEscape(id), "", nil, nil)
	return err
}

// CreateTenant creates a tenant (admin key). The answer carries its first webhook secret, shown once.
func (c *Client) CreateTenant(ctx context.Context, id string, limits *task.Limits) (*task.Tenant, error) {
	var out task.Tenant
	if _, err := c.do(ctx, http.MethodPost, "/admin/v1/tenants", "", task.CreateTenantRequest{ID: id, Limits: limits}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetTenant returns a tenant (admin key), without its secrets.
func (c *Client) GetTenant(ctx context.Context, id string) (*task.Tenant, error) {
	var out task.Tenant
	if _, err := c.do(ctx, http.MethodGet, "/admin/v1/tenants/"+url.PathEscape(id), "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetLimits replaces a tenant's limits (admin key).
func (c *Client) SetLimits(ctx context.Context, id string, limits task.Limits) (*task.Tenant, error) {
	var out task.Tenant
	if _, err := c.do(ctx, http.MethodPut, "/admin/v1/tenants/"+url.PathEscape(id)+"/limits", "", limits, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateAPIKey creates an API key for a tenant (admin key). The key is in the answer only.
func (c *Client) CreateAPIKey(ctx context.Context, tenant string) (*task.APIKey, error) {
	var out task.APIKey
	if _, err := c.do(ctx, http.MethodPost, "/admin/v1/tenants/"+url.PathEscape(tenant)+"/keys", "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeAPIKey revokes the key with keyID (admin key); it fails at once everywhere.
func (c *Client) RevokeAPIKey(ctx context.Context, keyID string) (*task.APIKey, error) {
	var out task.APIKey
	if _, err := c.do(ctx, http.MethodDelete, "/admin/v1/keys/"+url.PathEscape(keyID), "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RotateWebhookSecret gives a tenant a new webhook secret (admin key); the earlier ones keep
// signing until PreviousExpireAt.
func (c *Client) RotateWebhookSecret(ctx context.Context, tenant string) (*task.RotatedSecret, error) {
	var out task.RotatedSecret
	if _, err := c.do(ctx, http.MethodPost, "/admin/v1/tenants/"+url.PathEscape(tenant)+"/webhook-secrets:rotate", "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// do sends one call, retrying network errors, 5xx and 429 with the same body and key, and
// decodes a 2xx body into out (when not nil) or returns the answer's *Problem.
func (c *Client) do(ctx context.Context, method, path, idemKey string, in, out any) (http.Header, error) {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("genbox: encode request: %w", err)
		}
		body = b
	}
	for attempt := 0; ; attempt++ {
		h, retryAfter, err := c.once(ctx, method, path, idemKey, body, out)
		if err == nil {
			return h, nil
		}
		if !retryable(err) || attempt >= c.retries || ctx.Err() != nil {
			return nil, err
		}
		delay := c.retryDelay.Delay(attempt+1, nil)
		if retryAfter > 0 {
			delay = retryAfter
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// maxDetail bounds the detail kept from an error answer that is not a problem document.
const maxDetail = 512

// errTransport marks a failure to get any answer.
type errTransport struct{ err error }

func (e *errTransport) Error() string { return "genbox: " + e.err.Error() }
func (e *errTransport) Unwrap() error { return e.err }

func retryable(err error) bool {
	var te *errTransport
	if errors.As(err, &te) {
		return true
	}
	var p *task.Problem
	return errors.As(err, &p) && (p.Status >= 500 || p.Status == http.StatusTooManyRequests)
}

func (c *Client) once(ctx context.Context, method, path, idemKey string, body []byte, out any) (http.Header, time.Duration, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("genbox: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if idemKey != "" {
		req.Header.Set(task.HeaderIdempotencyKey, idemKey)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, 0, &errTransport{err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, 0, &errTransport{err}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out != nil && len(data) > 0 {
			if err := json.Unmarshal(data, out); err != nil {
				return nil, 0, fmt.Errorf("genbox: decode %s %s answer: %w", method, path, err)
			}
		}
		return resp.Header, 0, nil
	}
	p := problemFrom(resp, data)
	return nil, p.RetryAfter, p
}

// problemFrom is the *Problem of a non-2xx answer whose body is data.
func problemFrom(resp *http.Response, data []byte) *task.Problem {
	p := &task.Problem{}
	if json.Unmarshal(data, p) != nil || p.Status == 0 {
		detail := strings.TrimSpace(string(data))
		if len(detail) > maxDetail {
			detail = detail[:maxDetail] + "…"
		}
		p = &task.Problem{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode), Detail: detail}
	}
	p.Status = resp.StatusCode
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		p.RetryAfter = time.Duration(s) * time.Second
	}
	return p
}
