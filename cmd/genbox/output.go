package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// jsonFlag registers --json on a verb that prints data: the answer as the API gives it, for
// scripts, instead of the text for a person.
func jsonFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("json", false, "print JSON (as the API answers) instead of text")
}

// format is the output choice of a verb that printed JSON before it had a text form (get,
// cancel, submit --wait, admin, dlq show and decisions): scripts that read its output through a
// pipe keep getting JSON, and a person at a terminal gets text; --json and --text choose.
type format struct{ json, text *bool }

func formatFlags(fs *flag.FlagSet) format {
	return format{
		json: fs.Bool("json", false, "print JSON (as the API answers); the default when stdout is not a terminal"),
		text: fs.Bool("text", false, "print text; the default when stdout is a terminal"),
	}
}

// asJSON reports whether the answer printed to w is JSON.
func (f format) asJSON(w io.Writer) bool {
	if *f.json || *f.text {
		return *f.json
	}
	return !isTerminal(w)
}

// show prints v as JSON when asJSON, else as text: one aligned "label  value" row per field
// that has a value, then tail (a task's output) after a blank line when it is not empty.
func show(w io.Writer, asJSON bool, v any, rows [][2]string, tail string) error {
	if asJSON {
		return printJSON(w, v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		if r[1] != "" {
			fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if tail != "" {
		_, err := fmt.Fprintf(w, "\n%s\n", strings.TrimRight(tail, "\n"))
		return err
	}
	return nil
}

// showTask prints a task (get, cancel, submit --wait).
func showTask(w io.Writer, asJSON bool, v *task.View) error {
	family := v.Family
	if v.Variant != "" {
		family += "/" + v.Variant
	}
	state := string(v.State)
	if v.Replay > 0 {
		state += fmt.Sprintf(" (replay %d)", v.Replay)
	}
	model := v.Model
	for _, f := range []struct {
		on   bool
		name string
	}{{v.Degraded, "degraded"}, {v.Stale, "stale"}, {v.CacheHit, "cache hit"}} {
		if f.on && model != "" {
			model += ", " + f.name
		}
	}
	usage := ""
	if v.Usage.TotalTokens > 0 || v.CostUSD > 0 {
		usage = fmt.Sprintf("%d prompt + %d output tokens, $%.6f", v.Usage.PromptTokens, v.Usage.OutputTokens, v.CostUSD)
	}
	webhook := ""
	if v.Delivery.State != "" && v.Delivery.State != task.DeliveryNone {
		webhook = fmt.Sprintf("%s (%s)", v.Delivery.State, plural(v.Delivery.Attempts, "attempt"))
		if v.Delivery.LastStatus != 0 {
			webhook += fmt.Sprintf(", last status %d", v.Delivery.LastStatus)
		}
		if v.Delivery.LastError != "" {
			webhook += ": " + v.Delivery.LastError
		}
	}
	errText := ""
	if v.Error != nil {
		errText = string(v.Error.Kind) + ": " + v.Error.Message
	}
	var labels []string
	for k, val := range v.Labels {
		labels = append(labels, k+"="+val)
	}
	slices.Sort(labels)
	output := ""
	if v.Output != nil {
		output = *v.Output
	}
	return show(w, asJSON, v, [][2]string{
		{"task", v.TaskID}, {"state", state}, {"family", family}, {"model", model}, {"usage", usage},
		{"webhook", webhook}, {"error", errText}, {"labels", strings.Join(labels, " ")},
		{"created", when(&v.CreatedAt)}, {"starts after", when(v.StartAfter)}, {"completed", when(v.CompletedAt)},
	}, output)
}

// showTenant prints a tenant (admin tenant create, get, limits).
func showTenant(w io.Writer, asJSON bool, t *task.Tenant) error {
	l := t.Limits
	limits := fmt.Sprintf("concurrency %s, %s, daily budget %s", orNone(l.Concurrency > 0, fmt.Sprint(l.Concurrency)),
		orNone(l.SubmitRate > 0, fmt.Sprintf("%g submissions/s (burst %d)", l.SubmitRate, l.SubmitBurst)),
		budgetOf(l.DailyBudgetUSD))
	if l.Weight > 1 {
		limits += fmt.Sprintf(", weight %d", l.Weight)
	}
	if l.RPM > 0 || l.TPM > 0 {
		limits += fmt.Sprintf(", model quota %s rpm, %s tpm", orNone(l.RPM > 0, fmt.Sprint(l.RPM)), orNone(l.TPM > 0, fmt.Sprint(l.TPM)))
	}
	if len(l.AllowedBuckets) > 0 {
		limits += ", buckets " + strings.Join(l.AllowedBuckets, " ")
	}
	secret := ""
	if t.WebhookSecret != "" {
		secret = t.WebhookSecret + "   (shown once: keep it)"
	}
	return show(w, asJSON, t, [][2]string{
		{"tenant", t.ID}, {"limits", limits}, {"webhook secret", secret},
		{"webhook secrets", plural(len(t.WebhookSecrets), "active secret")}, {"created", when(&t.CreatedAt)},
	}, "")
}

// showAPIKey prints an API key (admin key create, revoke).
func showAPIKey(w io.Writer, asJSON bool, k *task.APIKey) error {
	key := ""
	if k.Key != "" {
		key = k.Key + "   (shown once: keep it)"
	}
	return show(w, asJSON, k, [][2]string{
		{"key id", k.KeyID}, {"key", key}, {"tenant", k.Tenant}, {"created", when(&k.CreatedAt)}, {"revoked", when(k.RevokedAt)},
	}, "")
}

// showRotated prints a rotated webhook secret (admin secret rotate).
func showRotated(w io.Writer, asJSON bool, r *task.RotatedSecret) error {
	return show(w, asJSON, r, [][2]string{
		{"tenant", r.Tenant}, {"webhook secret", r.WebhookSecret + "   (shown once: keep it)"},
		{"earlier secrets sign until", when(&r.PreviousExpireAt)},
	}, "")
}

// showDeadLetter prints a dead letter (dlq show and the decisions).
func showDeadLetter(w io.Writer, asJSON bool, d *task.DeadLetter) error {
	decided := ""
	if d.DecidedAt != nil {
		decided = d.DecidedBy + " at " + when(d.DecidedAt)
	}
	return show(w, asJSON, d, [][2]string{
		{"dead letter", d.ID}, {"task", d.TaskID}, {"stage", string(d.Stage)}, {"state", d.State},
		{"tenant", d.Tenant}, {"family", d.Family + "/" + d.Variant}, {"event", d.EventID},
		{"attempts", fmt.Sprint(d.Attempts)}, {"paid", fmt.Sprintf("%d tokens, $%.6f", d.Usage.TotalTokens, d.CostUSD)},
		{"last error", d.LastError}, {"decided", decided},
	}, "")
}

func when(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.Local().Format(time.RFC3339)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// budgetOf says what a tenant's daily budget is: its own, or the worker's default for 0.
func budgetOf(usd float64) string {
	if usd > 0 {
		return fmt.Sprintf("$%.2f", usd)
	}
	return "the default (GENBOX_DEFAULT_DAILY_BUDGET_USD)"
}

func orNone(ok bool, s string) string {
	if ok {
		return s
	}
	return "none"
}

// printFlags lists fs's flags as the help and the documentation spell them: --name TYPE, then the
// usage and a non-zero default.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch {
		case f.DefValue == "" || f.DefValue == "0" || f.DefValue == "false" || f.DefValue == "0s":
		case typ == "string":
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		default:
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// version describes this build from its build information: the module version (a tag when
// installed with go install …@version, "(devel)" from a checkout), the commit and its time when
// the build recorded them, and the Go release.
func version() string {
	v := "(unknown)"
	var extra []string
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if rev := settings["vcs.revision"]; rev != "" {
			extra = append(extra, "commit "+rev[:min(len(rev), 12)])
		}
		if at := settings["vcs.time"]; at != "" {
			extra = append(extra, at)
		}
		if settings["vcs.modified"] == "true" {
			extra = append(extra, "modified")
		}
	}
	extra = append(extra, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
	return "genbox " + v + " (" + strings.Join(extra, ", ") + ")"
}

// isTerminal reports whether w is a terminal (a character device): where a progress bar, redrawn
// in place, reads as one; in a file or a pipe it is only noise.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
