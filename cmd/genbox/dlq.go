package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

const dlqSynopsis = "list [--state S] | show ID | redeliver ID | regenerate ID | discard ID"

const dlqDescription = `Dead letters through the dlqnotifier's admin routes (GENBOX_DLQ_URL, admin key GENBOX_ADMIN_KEY),
for operators without Slack. A decision goes through the same transaction as a Slack click:
  redeliver   delivery stage: the same webhook (same webhook-id) is sent again; no model call
  regenerate  generation stage: the task runs again; its next webhook has a new webhook-id
  discard     either stage: generation — the task is discarded (a task.discarded webhook);
              delivery — the webhook is dropped
A decision is recorded as the admin key's ("admin key <digest>"), with --operator beside it as
the name you gave. A dead letter someone already decided is a conflict (exit 6) naming who
decided and when. Every action prints its answer: a table for list, the dead letter otherwise
(--json: as JSON).`

func runDLQ(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "dlq", dlqSynopsis, dlqDescription)
	base := fs.String("url", envOr(e.getenv, envDLQURL, defaultDLQURL), "the dlqnotifier's base URL ("+envDLQURL+")")
	key := fs.String("key", "", "the admin key (default $"+envAdminKey+")")
	state := fs.String("state", string(store.DeadLetterOpen), "list: dead letters in this state (open, redelivered, regenerated, discarded, superseded)")
	limit := fs.Int("limit", 100, "list: at most this many, oldest first")
	operator := fs.String("operator", defaultOperator(e.getenv), "redeliver/regenerate/discard: your name, recorded beside the admin key that decides")
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
	c, err := newClient(*base, envDLQURL, *key)
	if err != nil {
		return err
	}
	action := pos[0]
	switch action {
	case "list":
		if len(pos) != 1 {
			return usageErr("dlq list takes no id (see --help)")
		}
		out, err := c.ListDeadLetters(ctx, *state, *limit)
		if err != nil {
			return fmt.Errorf("dlq list: %w", err)
		}
		if *output.json {
			return printJSON(e.stdout, out)
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
		var dl *task.DeadLetter
		if action == "show" {
			dl, err = c.GetDeadLetter(ctx, id)
		} else {
			dl, err = c.DecideDeadLetter(ctx, id, action, strings.TrimSpace(*operator))
		}
		if err != nil {
			return fmt.Errorf("dlq %s %s: %w", action, id, err)
		}
		return showDeadLetter(e.stdout, output.asJSON(e.stdout), dl)
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
