package gemini

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genai"
)

// ErrBlocked means the model refused the prompt or stopped its answer for safety: a permanent failure.
var ErrBlocked = errors.New("gemini: blocked by safety filters")

// failure is one classified failed call.
type failure struct {
	class      Class
	code       int
	retryAfter time.Duration
	err        error
}

// classify sorts the error of one call. Generate checks its own context first: the caller giving
// up is reported as ctx.Err(), never as a failure of the model. Everything that is not an answer
// from the API (a timeout of the call, a reset, an unreadable answer) is a network failure: the
// call may have been billed.
func classify(err error) failure {
	var apiErr genai.APIError
	if !errors.As(err, &apiErr) {
		return failure{class: Network, err: err}
	}
	f := failure{code: apiErr.Code, err: err, retryAfter: retryDelay(apiErr.Details)}
	switch {
	case apiErr.Code == http.StatusTooManyRequests || apiErr.Code == http.StatusRequestTimeout || apiErr.Code >= 500:
		f.class = Transient
	default:
		f.class = Permanent
	}
	return f
}

// retryDelay returns the delay of a google.rpc.RetryInfo detail, or 0.
func retryDelay(details []map[string]any) time.Duration {
	for _, d := range details {
		if t, _ := d["@type"].(string); !strings.HasSuffix(t, "google.rpc.RetryInfo") {
			continue
		}
		switch v := d["retryDelay"].(type) {
		case string:
			if dur, err := time.ParseDuration(v); err == nil && dur > 0 {
				return dur
			}
		case map[string]any: // the protobuf Duration as an object: {"seconds": n, "nanos": n}
			secs, _ := v["seconds"].(float64)
			nanos, _ := v["nanos"].(float64)
			if dur := time.Duration(secs*float64(time.Second) + nanos); dur > 0 {
				return dur
			}
		}
	}
	return 0
}

// blocked reports a safety block in a 200 answer: prompt feedback with a block reason, or a
// candidate that finished for safety. Retrying the same prompt cannot help.
func blocked(resp *genai.GenerateContentResponse) error {
	if resp.PromptFeedback != nil && resp.PromptFeedback.BlockReason != "" && resp.PromptFeedback.BlockReason != genai.BlockedReasonUnspecified {
		return fmt.Errorf("%w: prompt blocked (%s)", ErrBlocked, resp.PromptFeedback.BlockReason)
	}
	if len(resp.Candidates) == 0 {
		return nil
	}
	switch r := resp.Candidates[0].FinishReason; r {
	case genai.FinishReasonSafety, genai.FinishReasonBlocklist, genai.FinishReasonProhibitedContent, genai.FinishReasonSPII, genai.FinishReasonRecitation:
		return fmt.Errorf("%w: finish reason %s", ErrBlocked, r)
	}
	return nil
}
