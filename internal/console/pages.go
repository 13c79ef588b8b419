package console

import (
	"cmp"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Bounds of what one page reads.
const (
	listLimit     = 200  // tasks of a search
	windowLimit   = 2000 // tasks of the overview's hour and the spend page's day
	deadLimit     = 1000 // open dead letters
	buckets       = 12   // the overview's hour in 5-minute buckets
	bucketMinutes = 5
)

var funcs = template.FuncMap{
	"usd":  func(v float64) string { return fmt.Sprintf("$%.6f", v) },
	"usd2": func(v float64) string { return fmt.Sprintf("$%.2f", v) },
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"whenp": func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"dur":    func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"mul100": func(v float64) float64 { return 100 * v },
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
}

var taskID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// overviewData is the Overview page.
type overviewData struct {
	Counts        []stateCount
	Throughput    chart
	P50, P95      time.Duration
	Finished      int
	HourTruncated bool
	SpendTenant   []spendRow
	SpendModel    chart
	Breakers      []store.Breaker
	Parked        int64
	SweeperLag    time.Duration
	Pending       bool
	OpenDead      map[string]int64 // by stage
	// Slots are the capped tenants' slots: running, waiting and the share of the cap in use.
	Slots []store.TenantSlotsView
}

type stateCount struct {
	State task.State
	N     int64
}

type spendRow struct {
	Tenant   string
	Day      string
	Spent    float64
	Budget   float64
	Fraction float64 // of the budget, capped at 1
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	ctx := r.Context()
	now := time.Now().UTC()
	var d overviewData
	counts, err := c.d.Store.CountTasks(ctx)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	for _, s := range task.States {
		d.Counts = append(d.Counts, stateCount{s, counts[s]})
	}
	d.Parked = counts[task.StateWaiting]
	hour, err := c.d.Store.SearchTasks(ctx, store.TaskFilter{Since: now.Add(-time.Hour), Limit: windowLimit})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.HourTruncated = len(hour) == windowLimit
	var lat []time.Duration
	per := make([]float64, buckets)
	for _, t := range hour {
		if t.CompletedAt == nil || !t.State.Finished() {
			continue
		}
		lat = append(lat, t.CompletedAt.Sub(t.CreatedAt))
		if i := int(now.Sub(*t.CompletedAt) / (bucketMinutes * time.Minute)); i >= 0 && i < buckets {
			per[buckets-1-i]++
		}
	}
	d.Finished = len(lat)
	slices.Sort(lat)
	if len(lat) > 0 {
		d.P50, d.P95 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*95/100)]
	}
	for i, v := range per {
		d.Throughput.Bars = append(d.Throughput.Bars, bar{Label: fmt.Sprintf("-%dm", (buckets-i)*bucketMinutes), Value: v, Text: fmt.Sprintf("%.0f", v)})
	}
	d.Throughput.scale()
	if d.SpendTenant, err = c.spendByTenant(r, []time.Time{now}); err != nil {
		c.fail(w, r, err)
		return
	}
	day, err := c.d.Store.SearchTasks(ctx, store.TaskFilter{Since: startOfDay(now), Limit: windowLimit})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.SpendModel = byModel(day)
	breakers, err := c.d.Store.ListBreakers(ctx)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	for _, b := range breakers {
		if b.State != string(gemini.BreakerClosed) {
			d.Breakers = append(d.Breakers, b)
		}
	}
	since, pending, err := c.d.Store.OldestPending(ctx)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if d.Pending = pending; pending {
		d.SweeperLag = max(now.Sub(since), 0).Round(time.Second) // a scheduled task's is its start
	}
	open, err := c.d.Store.OpenDeadLetters(ctx)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.OpenDead = map[string]int64{}
	for stage, n := range open {
		d.OpenDead[string(stage)] = n
	}
	if d.Slots, err = c.d.Store.TenantSlots(ctx); err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "overview", page{Title: "Overview", Nav: "overview", Operator: sess.Operator, CSRF: sess.CSRF, Live: true, Data: d})
}

func startOfDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// spendByTenant reads every tenant's spend counters on each day, against its daily budget.
func (c *Console) spendByTenant(r *http.Request, days []time.Time) ([]spendRow, error) {
	tenants, err := c.d.Store.ListTenants(r.Context())
	if err != nil {
		return nil, err
	}
	var out []spendRow
	for _, t := range tenants {
		for _, day := range days {
			spent, _, err := c.d.Store.Spent(r.Context(), t.ID, quota.Day(day), "")
			if err != nil {
				return nil, err
			}
			row := spendRow{Tenant: t.ID, Day: quota.Day(day), Spent: spent, Budget: t.Limits.DailyBudgetUSD}
			if row.Budget > 0 {
				row.Fraction = min(spent/row.Budget, 1)
			}
			out = append(out, row)
		}
	}
	return out, nil
}

// byModel sums the tasks' cost per model.
func byModel(ts []*protocol.Task) chart {
	sum := map[string]float64{}
	for _, t := range ts {
		if t.Model != "" || t.CostUSD > 0 {
			sum[cmp.Or(t.Model, "(none)")] += t.CostUSD
		}
	}
	var ch chart
	for _, m := range slices.Sorted(maps.Keys(sum)) {
		ch.Bars = append(ch.Bars, bar{Label: m, Value: sum[m], Text: fmt.Sprintf("$%.6f", sum[m])})
	}
	ch.scale()
	return ch
}

// chart is a bar chart drawn as inline SVG by the templates.
type chart struct {
	Bars []bar
	Max  float64
}

type bar struct {
	Label string
	Value float64
	Text  string
	Width float64 // percent of the widest
}

func (c *chart) scale() {
	for _, b := range c.Bars {
		c.Max = max(c.Max, b.Value)
	}
	for i := range c.Bars {
		if c.Max > 0 {
			c.Bars[i].Width = 100 * c.Bars[i].Value / c.Max
		}
	}
}

// tasksData is the Tasks page.
type tasksData struct {
	Filter    filterForm
	Tasks     []*protocol.Task
	Truncated bool
	States    []task.State
}

// filterForm is a search as its form shows it.
type filterForm struct {
	ID, Tenant, State, Family, Since, Until, Stage, Action string
}

// parseTime reads a form's time: RFC 3339, or the browser's datetime-local (UTC).
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02T15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2026-12-01T10:00 or RFC 3339)", s)
}

func (c *Console) tasks(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	q := r.URL.Query()
	f := filterForm{ID: strings.TrimSpace(q.Get("id")), Tenant: q.Get("tenant"), State: q.Get("state"), Family: q.Get("family"), Since: q.Get("since"), Until: q.Get("until")}
	if f.ID != "" {
		if !taskID.MatchString(f.ID) {
			c.message(w, http.StatusBadRequest, "Not a task id", "A task id is 32 hexadecimal characters.")
			return
		}
		http.Redirect(w, r, "/console/tasks/"+f.ID, http.StatusSeeOther)
		return
	}
	since, err1 := parseTime(f.Since)
	until, err2 := parseTime(f.Until)
	if err := errors.Join(err1, err2); err != nil {
		c.message(w, http.StatusBadRequest, "Bad search", err.Error())
		return
	}
	if f.State != "" && !task.State(f.State).Valid() {
		c.message(w, http.StatusBadRequest, "Bad search", "unknown state "+f.State)
		return
	}
	ts, err := c.d.Store.SearchTasks(r.Context(), store.TaskFilter{Tenant: f.Tenant, State: task.State(f.State), Family: f.Family, Since: since, Until: until, Limit: listLimit})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "tasks", page{Title: "Tasks", Nav: "tasks", Operator: sess.Operator, CSRF: sess.CSRF, Live: true,
		Data: tasksData{Filter: f, Tasks: ts, Truncated: len(ts) == listLimit, States: task.States}})
}

// taskData is a task's page.
type taskData struct {
	T           *protocol.Task
	DeadLetters []deadLetterRow
	Deliveries  []protocol.DeliveryAttempt
}

// deadLetterRow is a dead letter with the actions that apply to it.
type deadLetterRow struct {
	*store.DeadLetter
	Estimate   float64
	EstimateOK bool
}

func (d deadLetterRow) Open() bool { return d.State == store.DeadLetterOpen }

func (d deadLetterRow) Actions() []dlqnotifier.Action {
	if d.Stage == task.StageDelivery {
		return []dlqnotifier.Action{dlqnotifier.ActionRedeliver, dlqnotifier.ActionDiscard}
	}
	return []dlqnotifier.Action{dlqnotifier.ActionRegenerate, dlqnotifier.ActionDiscard}
}

func (c *Console) task(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	id := r.PathValue("id")
	if !taskID.MatchString(id) {
		c.message(w, http.StatusNotFound, "No such task", "A task id is 32 hexadecimal characters.")
		return
	}
	t, err := c.d.Store.GetTask(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		c.message(w, http.StatusNotFound, "No such task", "No task "+id+".")
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	dls, err := c.d.Store.DeadLettersOfTask(r.Context(), id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := taskData{T: t, Deliveries: t.Delivery.Log}
	for _, dl := range dls {
		d.DeadLetters = append(d.DeadLetters, c.row(dl, t))
	}
	c.render(w, r, "task", page{Title: "Task " + id, Nav: "tasks", Operator: sess.Operator, CSRF: sess.CSRF, Live: !t.State.Finished() || t.Delivery.State == task.DeliveryPending,
		Flash: r.URL.Query().Get("done"), Data: d})
}

// row prices a dead letter's Regenerate from its task.
func (c *Console) row(d *store.DeadLetter, t *protocol.Task) deadLetterRow {
	row := deadLetterRow{DeadLetter: d}
	if t != nil && d.Stage == task.StageGeneration {
		row.Estimate, row.EstimateOK = c.d.Estimator.EstimateUSD(t)
	}
	return row
}

// deadLettersData is the Dead letters page.
type deadLettersData struct {
	Filter    filterForm
	Rows      []deadLetterRow
	Truncated bool
}

// openDeadLetters reads the open dead letters matching f (tenant, stage, since) and their tasks.
func (c *Console) openDeadLetters(r *http.Request, f filterForm) ([]*store.DeadLetter, map[string]*protocol.Task, bool, error) {
	since, err := parseTime(f.Since)
	if err != nil {
		return nil, nil, false, err
	}
	all, err := c.d.Store.ListDeadLetters(r.Context(), store.DeadLetterOpen, deadLimit)
	if err != nil {
		return nil, nil, false, err
	}
	var out []*store.DeadLetter
	var ids []string
	for _, d := range all {
		if (f.Tenant == "" || d.Tenant == f.Tenant) && (f.Stage == "" || string(d.Stage) == f.Stage) && !d.CreatedAt.Before(since) {
			out = append(out, d)
			ids = append(ids, d.TaskID)
		}
	}
	ts, err := c.d.Store.GetTasks(r.Context(), ids)
	if err != nil {
		return nil, nil, false, err
	}
	byID := map[string]*protocol.Task{}
	for _, t := range ts {
		byID[t.ID] = t
	}
	return out, byID, len(all) == deadLimit, nil
}

func deadFilter(q url.Values) filterForm {
	return filterForm{Tenant: q.Get("tenant"), Stage: q.Get("stage"), Since: q.Get("since"), Action: q.Get("action")}
}

func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	f := deadFilter(r.URL.Query())
	dls, ts, truncated, err := c.openDeadLetters(r, f)
	if err != nil {
		c.message(w, http.StatusBadRequest, "Bad filter", err.Error())
		return
	}
	d := deadLettersData{Filter: f, Truncated: truncated}
	for _, dl := range dls {
		d.Rows = append(d.Rows, c.row(dl, ts[dl.TaskID]))
	}
	c.render(w, r, "deadletters", page{Title: "Dead letters", Nav: "dead", Operator: sess.Operator, CSRF: sess.CSRF,
		Flash: r.URL.Query().Get("done"), Data: d})
}

// decidedBy is how the console records who decided: as the admin routes do, the admin key that
// issued the session (the credential is all that was verified), with the operator's name kept
// beside it as what they said.
func (c *Console) decidedBy(sess store.ConsoleSession) string { return c.admin.Says(sess.Operator) }

// outcome says what a decision did, for the operator.
func outcome(id string, action dlqnotifier.Action, err error) string {
	var decided *dlqnotifier.DecidedError
	switch {
	case err == nil:
		return fmt.Sprintf("%s: %s recorded.", id, action)
	case errors.As(err, &decided):
		return fmt.Sprintf("%s: this dead letter was %s; nothing was repeated.", id, decided.Error())
	case errors.Is(err, dlqnotifier.ErrMovedOn), errors.Is(err, dlqnotifier.ErrAction), errors.Is(err, protocol.ErrBadDeadLetterID), errors.Is(err, store.ErrNotFound):
		return fmt.Sprintf("%s: nothing was changed: %v", id, err)
	}
	return ""
}

// decide is POST /console/dead-letters/{id} (form: action): the same decision as a Slack click.
func (c *Console) decide(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	id, action := r.PathValue("id"), dlqnotifier.Action(r.PostFormValue("action"))
	_, err := c.d.Decider.Decide(r.Context(), id, action, c.decidedBy(sess))
	msg := outcome(id, action, err)
	if msg == "" {
		c.fail(w, r, err)
		return
	}
	back := "/console/dead-letters"
	if taskID, _, perr := protocol.ParseDeadLetterID(id); perr == nil && r.PostFormValue("from") == "task" {
		back = "/console/tasks/" + taskID
	}
	http.Redirect(w, r, back+"?done="+url.QueryEscape(msg), http.StatusSeeOther)
}

// bulkData is the bulk decision's preview or its result.
type bulkData struct {
	Filter   filterForm
	Rows     []deadLetterRow
	Estimate float64
	Unpriced int
	Results  []string
}

// bulkSelection is the open dead letters a bulk action applies to: those of the filter the
// action applies to, one per task (a task is decided once).
func (c *Console) bulkSelection(r *http.Request, f filterForm) ([]deadLetterRow, error) {
	action := dlqnotifier.Action(f.Action)
	dls, ts, _, err := c.openDeadLetters(r, f)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var rows []deadLetterRow
	for _, dl := range dls {
		row := c.row(dl, ts[dl.TaskID])
		if seen[dl.TaskID] || !slices.Contains(row.Actions(), action) {
			continue
		}
		seen[dl.TaskID] = true
		rows = append(rows, row)
	}
	return rows, nil
}

func (c *Console) bulkPreview(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	f := deadFilter(r.URL.Query())
	if !slices.Contains([]dlqnotifier.Action{dlqnotifier.ActionRedeliver, dlqnotifier.ActionRegenerate, dlqnotifier.ActionDiscard}, dlqnotifier.Action(f.Action)) {
		c.message(w, http.StatusBadRequest, "Choose an action", "A bulk decision is redeliver, regenerate or discard.")
		return
	}
	rows, err := c.bulkSelection(r, f)
	if err != nil {
		c.message(w, http.StatusBadRequest, "Bad filter", err.Error())
		return
	}
	d := bulkData{Filter: f, Rows: rows}
	for _, row := range rows {
		if row.EstimateOK {
			d.Estimate += row.Estimate
		} else if f.Action == string(dlqnotifier.ActionRegenerate) {
			d.Unpriced++
		}
	}
	c.render(w, r, "bulk", page{Title: "Bulk decision", Nav: "dead", Operator: sess.Operator, CSRF: sess.CSRF, Data: d})
}

// bulkDecide is POST /console/bulk (form: action and the ids the preview showed): each dead
// letter decided through Decide, one per task; a second submission finds them decided.
func (c *Console) bulkDecide(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	action := dlqnotifier.Action(r.PostFormValue("action"))
	seen := map[string]bool{}
	d := bulkData{Filter: filterForm{Action: string(action)}}
	for _, id := range r.PostForm["id"] {
		taskID, _, err := protocol.ParseDeadLetterID(id)
		if err != nil || seen[taskID] {
			continue
		}
		seen[taskID] = true
		_, err = c.d.Decider.Decide(r.Context(), id, action, c.decidedBy(sess))
		msg := outcome(id, action, err)
		if msg == "" {
			c.d.Log.ErrorContext(r.Context(), "console: bulk decision failed", "dead_letter_id", id, "error", err)
			msg = id + ": the decision could not be recorded; nothing was changed. Try again."
		}
		d.Results = append(d.Results, msg)
	}
	c.render(w, r, "bulk", page{Title: "Bulk decision", Nav: "dead", Operator: sess.Operator, CSRF: sess.CSRF, Data: d})
}

// spendData is the Spend page.
type spendData struct {
	Days          []spendRow
	Models        chart
	SavedCache    float64
	SavedBatch    float64
	CacheHits     int
	Savings       chart
	Truncated     bool
	WindowStarted time.Time
}

func (c *Console) spend(w http.ResponseWriter, r *http.Request, sess store.ConsoleSession) {
	now := time.Now().UTC()
	days, err := c.spendByTenant(r, []time.Time{now.AddDate(0, 0, -2), now.AddDate(0, 0, -1), now})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	from := now.Add(-24 * time.Hour)
	ts, err := c.d.Store.SearchTasks(r.Context(), store.TaskFilter{Since: from, Limit: windowLimit})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := spendData{Days: days, Models: byModel(ts), Truncated: len(ts) == windowLimit, WindowStarted: from}
	d.SavedCache, d.SavedBatch, d.CacheHits = savings(ts, c.d.Pricing)
	d.Savings = chart{Bars: []bar{
		{Label: "context cache", Value: d.SavedCache, Text: fmt.Sprintf("$%.6f", d.SavedCache)},
		{Label: "batch and flex", Value: d.SavedBatch, Text: fmt.Sprintf("$%.6f", d.SavedBatch)},
	}}
	d.Savings.scale()
	c.render(w, r, "spend", page{Title: "Spend", Nav: "spend", Operator: sess.Operator, CSRF: sess.CSRF, Data: d})
}

// savings prices what the tasks saved: by context caching, their cached prompt tokens at the
// tier's rate minus what they were billed at (plus, for an output-cache hit, the mean cost of
// the family's paid tasks of the window); by batch and flex, the standard tier's bill minus
// theirs.
func savings(ts []*protocol.Task, p gemini.Pricing) (cache, batch float64, hits int) {
	paid, n := map[string]float64{}, map[string]int{}
	for _, t := range ts {
		if t.CacheHit || t.Model == "" {
			continue
		}
		paid[t.Family] += t.CostUSD
		n[t.Family]++
		tier := gemini.TierStandard
		switch t.Mode {
		case task.ModeBatch:
			tier = gemini.TierBatch
		case task.ModeFlex:
			tier = gemini.TierFlex
		}
		price := p.Price(t.Model)
		uncached := t.Usage
		uncached.CachedTokens = 0
		cache += max(price.Bill(uncached, tier)-price.Bill(t.Usage, tier), 0)
		batch += max(price.Bill(t.Usage, gemini.TierStandard)-price.Bill(t.Usage, tier), 0)
	}
	for _, t := range ts {
		if t.CacheHit && n[t.Family] > 0 {
			hits++
			cache += paid[t.Family] / float64(n[t.Family])
		}
	}
	return cache, batch, hits
}
