package doubles

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"
)

// SlackCall is one Slack Web API call the double received.
type SlackCall struct {
	Method  string     // e.g. "chat.postMessage"
	Form    url.Values // the call's arguments (slack-go sends them form-encoded)
	Channel string
	TS      string // the message the call posted or updated
	// Error is the error Slack answered ("invalid_auth"; "http 500" for a failed call), "" when ok.
	Error string
	At    time.Time
}

// Blocks decodes the call's Block Kit blocks.
func (c SlackCall) Blocks() (slack.Blocks, error) {
	var b slack.Blocks
	if s := c.Form.Get("blocks"); s != "" {
		if err := json.Unmarshal([]byte(s), &b); err != nil {
			return b, fmt.Errorf("decode blocks of %s: %w", c.Method, err)
		}
	}
	return b, nil
}

// Slack is the Slack Web API at /api/{method}, the base that slack-go's OptionAPIURL points at
// (the dlqnotifier's GENBOX_SLACK_API_URL plus "/api/"): it records every call and answers
// chat.postMessage with a new message ts, chat.update with the message's ts, chat.postEphemeral
// with a message_ts, and anything else with ok. It keeps the latest version of every message. Set
// its exported fields before it serves.
type Slack struct {
	// Token, when set, is the bot token every call must carry: a call without it is answered
	// invalid_auth.
	Token string
	// Log, when set, logs every call.
	Log *slog.Logger

	calls record[SlackCall]

	mu       sync.Mutex
	fail     func(method string, n int) bool
	per      map[string]int       // calls of each method so far
	messages map[string]SlackCall // channel/ts -> the latest post or update of the message
	seq      int
	// hold and arrived, when set, hold the next chat.postMessage (HoldNextPost).
	hold, arrived chan struct{}
}

var _ http.Handler = (*Slack)(nil)

// SetFail makes Slack answer 500 to the nth call (1-based) of method whenever fail says so; nil
// fails nothing. The failed calls are recorded too.
func (s *Slack) SetFail(fail func(method string, n int) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fail
}

// HoldNextPost holds the next chat.postMessage once it is recorded: arrived is signalled when it
// has reached Slack, and Slack answers it once release is called.
func (s *Slack) HoldNextPost() (arrived <-chan struct{}, release func()) {
	hold, got := make(chan struct{}), make(chan struct{}, 1)
	s.mu.Lock()
	s.hold, s.arrived = hold, got
	s.mu.Unlock()
	return got, sync.OnceFunc(func() { close(hold) })
}

// ServeHTTP answers the Web API calls under /api/.
func (s *Slack) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	method, ok := strings.CutPrefix(r.URL.Path, "/api/")
	if r.Method != http.MethodPost || !ok || method == "" {
		http.NotFound(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		writeSlack(w, map[string]any{"ok": false, "error": "invalid_form_data"})
		return
	}
	c := SlackCall{Method: method, Form: r.PostForm, Channel: r.PostForm.Get("channel"), At: time.Now()}
	s.mu.Lock()
	if s.per == nil {
		s.per, s.messages = map[string]int{}, map[string]SlackCall{}
	}
	s.per[method]++
	failed := s.fail != nil && s.fail(method, s.per[method])
	var hold, arrived chan struct{}
	if method == "chat.postMessage" {
		hold, arrived, s.hold, s.arrived = s.hold, s.arrived, nil, nil // only the next post is held
	}
	switch {
	case s.Token != "" && r.PostForm.Get("token") != s.Token:
		c.Error = "invalid_auth"
	case failed:
		c.Error = "http 500"
	case method == "chat.postMessage":
		c.TS = s.nextTS(c.At)
		s.messages[c.Channel+"/"+c.TS] = c
	case method == "chat.postEphemeral":
		c.TS = s.nextTS(c.At)
	case method == "chat.update":
		c.TS = r.PostForm.Get("ts")
		s.messages[c.Channel+"/"+c.TS] = c
	}
	s.mu.Unlock()
	s.calls.add(c)
	if s.Log != nil {
		s.Log.InfoContext(r.Context(), "slack double", "method", c.Method, "channel", c.Channel, "ts", c.TS, "error", c.Error)
	}
	if hold != nil {
		arrived <- struct{}{}
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case c.Error == "http 500":
		w.WriteHeader(http.StatusInternalServerError)
	case c.Error != "":
		writeSlack(w, map[string]any{"ok": false, "error": c.Error})
	case method == "chat.postEphemeral":
		writeSlack(w, map[string]any{"ok": true, "message_ts": c.TS})
	default:
		writeSlack(w, map[string]any{"ok": true, "channel": c.Channel, "ts": c.TS, "text": r.PostForm.Get("text")})
	}
}

// nextTS returns a new message ts, unique in the double: Slack's form, seconds.sequence.
func (s *Slack) nextTS(at time.Time) string {
	s.seq++
	return strconv.FormatInt(at.Unix(), 10) + "." + fmt.Sprintf("%06d", s.seq)
}

func writeSlack(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// Calls returns the calls of method ("" for every call) so far, in order; failed calls too.
func (s *Slack) Calls(method string) []SlackCall {
	all := s.calls.all()
	if method == "" {
		return all
	}
	var out []SlackCall
	for _, c := range all {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// Posts returns the chat.postMessage calls that Slack accepted, in order.
func (s *Slack) Posts() []SlackCall {
	var out []SlackCall
	for _, c := range s.Calls("chat.postMessage") {
		if c.Error == "" {
			out = append(out, c)
		}
	}
	return out
}

// WaitCall returns the first call that match accepts, waiting for it until ctx ends.
func (s *Slack) WaitCall(ctx context.Context, match func(SlackCall) bool) (SlackCall, error) {
	return s.calls.wait(ctx, match)
}

// Message returns the latest version (post or update) of the message channel/ts.
func (s *Slack) Message(channel, ts string) (SlackCall, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.messages[channel+"/"+ts]
	return c, ok
}

// Messages returns the latest version of every message posted, in no particular order.
func (s *Slack) Messages() []SlackCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SlackCall, 0, len(s.messages))
	for _, m := range s.messages {
		out = append(out, m)
	}
	return out
}
