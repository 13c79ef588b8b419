package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/client"
)

const dlqSynopsis = "list [--state S] | show ID | redeliver ID | regenerate ID | discard ID"

const dlqDescription = `Dead letters through the dlqnotifier's admin routes (GENBOX_DLQ_URL, admin key GENBOX_ADMIN_KEY),
for operators without Slack. A decision goes through the same transaction as a Slack click:
  redeliver   delivery stage: the same webhook (same webhook-id) is sent again; no model call
  regenerate  generation stage: the task runs again; its next webhook has a new webhook-id
  discard     either stage: generation — the task is discarded (a task.discarded webhook);
              delivery — the webhook is dropped
A dead letter someone already decided is a conflict (exit 6) naming who decided and when. Every
action prints its answer: a table for list, the dead letter otherwise (--json: as JSON).`

// dlqAdminPath is the dlqnotifier's admin prefix (internal/dlqnotifier.AdminPrefix).
const dlqAdminPath = "/admin/dead-letters"

func runDLQ(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "dlq", dlqSynopsis, dlqDescription)
	base := fs.String("url", envOr(e.getenv, envDLQURL, defaultDLQURL), "the dlqnotifier's base URL ("+envDLQURL+")")
	key := fs.String("key", "", "the admin key (default $"+envAdminKey+")")
	state := fs.String("state", string(store.DeadLetterOpen), "list: dead letters in this state (open, redelivered, regenerated, discarded, superseded)")
	limit := fs.Int("limit", 100, "list: at most this many, oldest first")
	operator := fs.String("operator", defaultOperator(e.getenv), "redeliver/regenerate/discard: who decides (recorded on the dead letter)")
	output := formatFlags(fs)
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErr("dlq needs an action: genbox dlq %s", dlqSynopsis)
	}
	if *key == "" {
		*key = e.getenv(envAdminKey)
	}
	if *key == "" {
		return &exitError{code: exitAuth, msg: "no admin key: set " + envAdminKey + " or pass --key (`genbox dev` prints it)"}
	}
	d := dlqClient{base: strings.TrimRight(*base, "/"), key: *key, hc: &http.Client{Timeout: 30 * time.Second}}
	action := pos[0]
	switch action {
	case "list":
		if len(pos) != 1 {
			return usageErr("dlq list takes no id (see --help)")
		}
		var out struct {
			DeadLetters []store.DeadLetter `json:"dead_letters"`
		}
		q := url.Values{"state": {*state}, "limit": {strconv.Itoa(*limit)}}
		raw, err := d.do(ctx, http.MethodGet, dlqAdminPath+"?"+q.Encode(), nil, &out)
		if err != nil {
			return fmt.Errorf("dlq list: %w", err)
		}
		if *output.json {
			_, err := e.stdout.Write(raw)
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DEAD_LETTER\tSTAGE\tSTATE\tTENANT\tFAMILY\tATTEMPTS\tCOST_USD\tLAST_ERROR")
		for _, dl := range out.DeadLetters {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s/%s\t%d\t%.6f\t%s\n", dl.ID, dl.Stage, dl.State, dl.Tenant, dl.Family, dl.Variant,
				dl.Attempts, dl.CostUSD, oneLine(dl.LastError, 60))
		}
		return tw.Flush()
	case "show", "redeliver", "regenerate", "discard":
		if len(pos) != 2 {
			return usageErr("dlq %s takes exactly one dead letter id (see `genbox dlq list`)", action)
		}
		id := pos[1]
		var raw []byte
		if action == "show" {
			raw, err = d.do(ctx, http.MethodGet, dlqAdminPath+"/"+url.PathEscape(id), nil, nil)
		} else {
			if strings.TrimSpace(*operator) == "" {
				return usageErr("--operator must name who decides")
			}
			raw, err = d.do(ctx, http.MethodPost, dlqAdminPath+"/"+url.PathEscape(id)+":"+action, map[string]string{"operator": *operator}, nil)
		}
		if err != nil {
			return fmt.Errorf("dlq %s %s: %w", action, id, err)
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			_, err := e.stdout.Write(raw)
			return err
		}
		var dl store.DeadLetter
		if output.asJSON(e.stdout) || json.Unmarshal(raw, &dl) != nil || dl.ID == "" {
			return printJSON(e.stdout, v)
		}
		return showDeadLetter(e.stdout, false, &dl)
	}
	return usageErr("unknown dlq action %q: genbox dlq %s", action, dlqSynopsis)
}

func defaultOperator(getenv func(string) string) string {
	if u := getenv("USER"); u != "" {
		return u
	}
	if h, err := os.Hostname(); err == nil {
		return "operator@" + h
	}
	return "operator"
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// dlqClient calls the dlqnotifier's admin routes.
type dlqClient struct {
	base, key string
	hc        *http.Client
}

// do sends one call and returns the answer's body, decoded into out when out is not nil. A
// non-2xx answer is a *client.Problem, so exit codes follow the same rules as the publisher's.
func (d dlqClient) do(ctx context.Context, method, path string, in, out any) ([]byte, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, body)
	if err != nil {
		return nil, usageErr("--url %q: %v", d.base, err)
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		p := &client.Problem{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode)}
		var answer struct {
			Error  string `json:"error"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(raw, &answer) == nil {
			p.Detail = answer.Error + answer.Detail
		} else {
			p.Detail = oneLine(string(raw), 200)
		}
		return nil, p
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("decode the dlqnotifier's answer: %w", err)
		}
	}
	return raw, nil
}
