package console

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// rerunForm is the re-run page's filter as the form holds it.
type rerunForm struct {
	Tenant, State, Family, Variant, Labels, CreatedAfter, CreatedBefore, PromptVersion string
}

func rerunFormOf(v url.Values) rerunForm {
	return rerunForm{Tenant: v.Get("tenant"), State: v.Get("state"), Family: v.Get("family"), Variant: v.Get("variant"),
		Labels: v.Get("labels"), CreatedAfter: v.Get("created_after"), CreatedBefore: v.Get("created_before"),
		PromptVersion: v.Get("prompt_version")}
}

// filter is the API's filter of f; labels are "k=v, k=v".
func (f rerunForm) filter() (task.RerunFilter, error) {
	out := task.RerunFilter{State: task.State(f.State), Family: f.Family, Variant: f.Variant, PromptVersion: f.PromptVersion}
	for item := range strings.SplitSeq(f.Labels, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok || k == "" {
			return out, fmt.Errorf("labels: %q is not key=value", item)
		}
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		out.Labels[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	for _, t := range []struct {
		name, v string
		dst     **time.Time
	}{{"created_after", f.CreatedAfter, &out.CreatedAfter}, {"created_before", f.CreatedBefore, &out.CreatedBefore}} {
		if t.v == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339, t.v)
		if err != nil {
			return out, fmt.Errorf("%s: %q is not an RFC 3339 time", t.name, t.v)
		}
		*t.dst = &at
	}
	return out, rerun.Validate(out)
}

// rerunsData is the re-run page: the filter, its estimate once asked for, and the re-runs
// still running.
type rerunsData struct {
	Form     rerunForm
	Estimate *task.Rerun
	// RerunID names the re-run the estimate's form starts: submitting it twice starts one.
	RerunID string
	// States are the states a filter may name (rerun.Runnable).
	States  []task.State
	Running []*store.Rerun
}

// reruns is GET /console/reruns: the running re-runs and their progress; with a tenant, the
// estimate of the filter (the API's dry run) and the form that starts it.
func (c *Console) reruns(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	d := rerunsData{Form: rerunFormOf(r.URL.Query()), States: rerun.Runnable}
	if d.Form.Tenant != "" {
		f, err := d.Form.filter()
		if err != nil {
			c.message(w, http.StatusBadRequest, "Bad filter", err.Error())
			return
		}
		est, err := c.planner().DryRun(r.Context(), d.Form.Tenant, f)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Estimate, d.RerunID = &est, "console-"+randomToken()[:16]
	}
	running, err := c.d.Store.RunningReruns(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.Running = running
	c.render(w, r, "reruns", page{Title: "Re-runs", Nav: "reruns", Operator: sess.Operator, CSRF: sess.CSRF,
		Live: len(running) > 0 && d.Estimate == nil, Flash: r.URL.Query().Get("done"), Data: d})
}

// startRerun is POST /console/reruns (form: the filter and the estimate's rerun_id): the
// re-run the estimate showed, created as the API creates it, recorded as the session's.
func (c *Console) startRerun(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	form := rerunFormOf(r.PostForm)
	f, err := form.filter()
	if err != nil || form.Tenant == "" {
		c.message(w, http.StatusBadRequest, "Bad filter", cmp.Or(err, errors.New("tenant: required")).Error())
		return
	}
	rr, replayed, err := c.planner().Start(r.Context(), form.Tenant, r.PostFormValue("rerun_id"), c.decidedBy(sess), f)
	if errors.Is(err, rerun.ErrIDReused) {
		c.message(w, http.StatusConflict, "Already used", "This form started a re-run of another filter: estimate again.")
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	msg := fmt.Sprintf("Re-run %s of tenant %s started: %d tasks, about $%.6f.", rr.RerunID, rr.Tenant, rr.Count, rr.EstimatedCostUSD)
	if replayed {
		msg = fmt.Sprintf("Re-run %s of tenant %s was started already; nothing was repeated.", rr.RerunID, rr.Tenant)
	}
	http.Redirect(w, r, "/console/reruns?done="+url.QueryEscape(msg), http.StatusSeeOther)
}

// planner counts, prices and starts re-runs as the API does.
func (c *Console) planner() rerun.Planner {
	return rerun.Planner{Store: c.d.Store, Estimator: rerun.Estimator{Pricing: c.d.Pricing, Prompts: c.d.Prompts}}
}
