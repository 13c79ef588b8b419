package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/slack-go/slack"

	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/store"
)

// Signer signs an interaction request body exactly as Slack does (the dlqnotifier's helper).
type Signer func(ts time.Time, body []byte) http.Header

// DeadLetters lists the open dead letters the console shows (*store.Store).
type DeadLetters interface {
	ListDeadLetters(ctx context.Context, state store.DeadLetterState, limit int) ([]*store.DeadLetter, error)
}

var _ DeadLetters = (*store.Store)(nil)

// Slack is the Slack double of the dev stack. Under /api/ the shared double answers the Web API
// calls the dlqnotifier makes and records them; at / it serves the "Slack console": the open dead
// letters from Firestore, each with the buttons of the message the dlqnotifier posted for it. A
// click is sent to the dlqnotifier's /slack/interactions as a block_actions payload from the
// approver, signed as Slack signs.
type Slack struct {
	*doubles.Slack
	// Interactions is the dlqnotifier's /slack/interactions URL.
	Interactions string
	// Approver is the Slack user id the console clicks as.
	Approver string
	Sign     Signer
	Store    DeadLetters
	// HTTP sends the interactions (http.DefaultClient when nil).
	HTTP *http.Client
}

var _ http.Handler = (*Slack)(nil)

// ServeHTTP serves the Web API double and the console.
func (s *Slack) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mux := http.NewServeMux()
	mux.Handle("POST /api/{method}", s.Slack)
	mux.HandleFunc("GET /{$}", s.serveConsole)
	mux.HandleFunc("POST /console/click", s.serveClick)
	mux.ServeHTTP(w, r)
}

// button is one button of a posted message, as the console shows it.
type button struct {
	Text, ActionID, BlockID, Value string
}

// buttons lists the buttons of a message's action blocks.
func buttons(c doubles.SlackCall) ([]button, error) {
	blocks, err := c.Blocks()
	if err != nil {
		return nil, err
	}
	var out []button
	for _, b := range blocks.BlockSet {
		ab, ok := b.(*slack.ActionBlock)
		if !ok || ab.Elements == nil {
			continue
		}
		for _, e := range ab.Elements.ElementSet {
			if be, ok := e.(*slack.ButtonBlockElement); ok {
				text := be.ActionID
				if be.Text != nil {
					text = be.Text.Text
				}
				out = append(out, button{Text: text, ActionID: be.ActionID, BlockID: ab.BlockID, Value: be.Value})
			}
		}
	}
	return out, nil
}

type consoleRow struct {
	DL      *store.DeadLetter
	Posted  bool
	Buttons []button
	Note    string
}

var consolePage = template.Must(template.New("console").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>genbox dev — Slack console</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.4em;vertical-align:top}form{display:inline}.msg{color:#a00}</style>
</head><body>
<h1>Slack console</h1>
<p>Open dead letters, with the buttons of the message the dlqnotifier posted to Slack. A click is
sent to <code>{{.Interactions}}</code> as approver <code>{{.Approver}}</code>, signed as Slack signs it.</p>
{{with .Flash}}<p class="msg">{{.}}</p>{{end}}
{{if not .Rows}}<p>No open dead letters.</p>{{else}}
<table><tr><th>Dead letter</th><th>Stage</th><th>Attempts</th><th>Last error</th><th>Tokens / cost</th><th>Decide</th></tr>
{{range .Rows}}<tr><td><code>{{.DL.ID}}</code><br>tenant {{.DL.Tenant}}, {{.DL.Family}}/{{.DL.Variant}}</td>
<td>{{.DL.Stage}}</td><td>{{.DL.Attempts}}</td><td>{{.DL.LastError}}</td>
<td>{{.DL.Usage.TotalTokens}} tokens, ${{printf "%.6f" .DL.CostUSD}}</td>
<td>{{if .Posted}}{{range .Buttons}}<form method="post" action="/console/click">
<input type="hidden" name="dl" value="{{.Value}}"><input type="hidden" name="action_id" value="{{.ActionID}}">
<button>{{.Text}}</button></form> {{end}}{{else}}{{.Note}}{{end}}</td></tr>
{{end}}</table>{{end}}
</body></html>`))

func (s *Slack) serveConsole(w http.ResponseWriter, r *http.Request) {
	dls, err := s.Store.ListDeadLetters(r.Context(), store.DeadLetterOpen, 200)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var rows []consoleRow
	for _, dl := range dls {
		row := consoleRow{DL: dl, Note: "not posted to Slack yet"}
		if c, ok := s.Message(dl.SlackChannel, dl.SlackTS); ok {
			bs, err := buttons(c)
			if err != nil {
				row.Note = err.Error()
			} else {
				row.Posted, row.Buttons = true, bs
			}
		}
		rows = append(rows, row)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = consolePage.Execute(w, map[string]any{"Rows": rows, "Interactions": s.Interactions, "Approver": s.Approver,
		"Flash": r.URL.Query().Get("msg")})
}

// serveClick presses the button a console form names, then shows the console with the answer.
func (s *Slack) serveClick(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	answer, err := s.Click(r.Context(), r.PostForm.Get("dl"), r.PostForm.Get("action_id"))
	msg := answer
	switch {
	case err != nil:
		msg = err.Error()
	case msg == "":
		msg = r.PostForm.Get("action_id") + " applied to " + r.PostForm.Get("dl")
	}
	http.Redirect(w, r, "/?msg="+url.QueryEscape(msg), http.StatusSeeOther)
}

// ErrNoButton means the dead letter's Slack message has no such button (or was never posted).
var ErrNoButton = errors.New("devstack: no such button on the dead letter's Slack message")

// Click presses the button actionID of the Slack message posted for dead letter id, as the
// approver: it sends the block_actions payload Slack would send, signed, to the dlqnotifier and
// returns the text of its answer.
func (s *Slack) Click(ctx context.Context, deadLetterID, actionID string) (string, error) {
	msg, btn, err := s.findButton(deadLetterID, actionID)
	if err != nil {
		return "", err
	}
	return s.ClickAs(ctx, s.Approver, msg, btn.ActionID, btn.BlockID, btn.Value)
}

func (s *Slack) findButton(deadLetterID, actionID string) (doubles.SlackCall, button, error) {
	for _, m := range s.Messages() {
		bs, err := buttons(m)
		if err != nil {
			continue
		}
		for _, b := range bs {
			if b.Value == deadLetterID && b.ActionID == actionID {
				return m, b, nil
			}
		}
	}
	return doubles.SlackCall{}, button{}, fmt.Errorf("%w: dead letter %s, action %s", ErrNoButton, deadLetterID, actionID)
}

// ClickAs sends a block_actions payload for one button of msg from user, signed as Slack signs.
// It returns what the dlqnotifier told the user: the ephemeral message it posted for them during
// the click (a refusal, "already decided by …"), or "" when it said nothing (the decision was
// applied and the message updated).
func (s *Slack) ClickAs(ctx context.Context, user string, msg doubles.SlackCall, actionID, blockID, value string) (string, error) {
	cb := slack.InteractionCallback{
		Type:      slack.InteractionTypeBlockActions,
		Token:     "devstack",
		TriggerID: "devstack-trigger",
		Team:      slack.Team{ID: "TDEV", Name: "genbox-dev"},
		User:      slack.User{ID: user, Name: user},
		Channel:   slack.Channel{GroupConversation: slack.GroupConversation{Conversation: slack.Conversation{ID: msg.Channel}}},
		Container: slack.Container{Type: "message", ChannelID: msg.Channel, MessageTs: msg.TS},
		Message:   slack.Message{Msg: slack.Msg{Timestamp: msg.TS, Channel: msg.Channel, Text: msg.Form.Get("text")}},
		ActionCallback: slack.ActionCallbacks{BlockActions: []*slack.BlockAction{{
			ActionID: actionID, BlockID: blockID, Value: value, Type: slack.ActionType("button"),
			ActionTs: strconv.FormatInt(time.Now().Unix(), 10) + ".000000",
		}}},
	}
	payload, err := json.Marshal(&cb)
	if err != nil {
		return "", fmt.Errorf("encode interaction: %w", err)
	}
	body := []byte(url.Values{"payload": {string(payload)}}.Encode())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Interactions, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	for k, vs := range s.Sign(time.Now(), body) {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	hc := s.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	before := len(s.Calls(""))
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("post interaction: %w", err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%w: %s: %s", ErrRefused, resp.Status, bytes.TrimSpace(text))
	}
	for _, c := range s.Calls("")[before:] {
		if c.Method == "chat.postEphemeral" && c.Form.Get("user") == user {
			return c.Form.Get("text"), nil
		}
	}
	return "", nil
}

// ErrRefused means the dlqnotifier answered an interaction with an error status (a bad
// signature is a 401).
var ErrRefused = errors.New("devstack: the dlqnotifier refused the interaction")
