package deploycheck_test

import (
	"bytes"
	"errors"
	"fmt"
	"go/build"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"cloud.google.com/go/cloudbuild/apiv1/v2/cloudbuildpb"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/deploycheck"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/publisher"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/worker"
)

const (
	repoRoot     = "../.."
	terraformDir = repoRoot + "/infra/terraform"
	// pushPath is where the push consumers mount bus.Push.
	pushPath = resulthandler.PushPath
	// minGoPatch is the oldest Go 1.26 patch release the images may be built with: the newest
	// served when this was written, fixing standard-library advisories of earlier ones.
	minGoPatch = 11
)

// testVars gives the variables without defaults a value, as an operator's tfvars would.
var testVars = map[string]cty.Value{
	"project_id":      cty.StringVal("genbox-test"),
	"image_tag":       cty.StringVal("abc1234"),
	"slack_channel":   cty.StringVal("C0123456789"),
	"slack_approvers": cty.ListVal([]cty.Value{cty.StringVal("U0123456789")}),
}

func loadModule(t *testing.T, dir string) *deploycheck.Module {
	t.Helper()
	m, err := deploycheck.LoadModule(dir, testVars)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// terraformFiles is every .tf file of infra/terraform, by path.
func terraformFiles(t *testing.T) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(terraformDir, "*.tf"))
	if err != nil {
		t.Fatal(err)
	}
	files := make(map[string][]byte, len(paths))
	for _, p := range paths {
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = src
	}
	return files
}

// brokenCopy copies infra/terraform to a temporary directory with each edit applied (old → new,
// old must occur), so a test can show that a check fails when the configuration drifts.
func brokenCopy(t *testing.T, edits map[string][2]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, src := range terraformFiles(t) {
		name := filepath.Base(p)
		if e, ok := edits[name]; ok {
			if !strings.Contains(string(src), e[0]) {
				t.Fatalf("%s does not contain %q", name, e[0])
			}
			src = []byte(strings.Replace(string(src), e[0], e[1], 1))
		}
		if err := os.WriteFile(filepath.Join(dir, name), src, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func wantErrors(t *testing.T, errs []error, substrings ...string) {
	t.Helper()
	joined := errors.Join(errs...)
	if joined == nil {
		t.Fatalf("no error; want errors mentioning %q", substrings)
	}
	for _, s := range substrings {
		if !strings.Contains(joined.Error(), s) {
			t.Errorf("errors do not mention %q:\n%v", s, joined)
		}
	}
}

func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for _, err := range errs {
		t.Error(err)
	}
}

func TestVariableValidations(t *testing.T) {
	t.Parallel()
	noErrors(t, loadModule(t, terraformDir).CheckValidations())

	t.Run("a value outside its validation fails", func(t *testing.T) {
		vars := maps.Clone(testVars)
		vars["worker_max_instances"] = cty.NumberIntVal(0)
		vars["slack_channel"] = cty.StringVal("#genbox")
		m, err := deploycheck.LoadModule(terraformDir, vars)
		if err != nil {
			t.Fatal(err)
		}
		wantErrors(t, m.CheckValidations(), `"worker_max_instances"`, `"slack_channel"`)
	})
}

// pubsubWant is internal/bus's topology, with how each subscription is consumed.
func pubsubWant(m *deploycheck.Module) deploycheck.PubSubWant {
	topo := bus.DefaultTopology()
	http := m.Resource("google_cloud_run_v2_service", "http")
	pushedTo := map[string]string{
		bus.SubWorker:     "", // streaming pull
		bus.SubResults:    "resulthandler",
		bus.SubTasksDLQ:   "dlqnotifier",
		bus.SubResultsDLQ: "dlqnotifier",
		bus.SubAlerts:     "dlqnotifier",
	}
	w := deploycheck.PubSubWant{
		Topics:              bus.Topics,
		AckDeadline:         topo.AckDeadline,
		MaxDeliveryAttempts: topo.MaxDeliveryAttempts,
		MinBackoff:          topo.MinBackoff,
		MaxBackoff:          topo.MaxBackoff,
		PushPath:            pushPath,
		AgentDomain:         "gcp-sa-pubsub.iam.gserviceaccount.com",
	}
	for _, s := range bus.Subscriptions {
		svc, ok := pushedTo[s.Name]
		if !ok {
			panic("subscription " + s.Name + " has no consumer in this test: say how it is consumed")
		}
		sw := deploycheck.SubscriptionWant{Name: s.Name, Topic: s.Topic, DeadLetterTopic: s.DeadLetterTopic}
		if svc != "" && http != nil {
			sw.PushTo = http.Instance(cty.StringVal(svc))
		}
		w.Subscriptions = append(w.Subscriptions, sw)
	}
	return w
}

func TestPubSubMatchesBus(t *testing.T) {
	t.Parallel()
	m := loadModule(t, terraformDir)
	noErrors(t, deploycheck.CheckPubSub(m, pubsubWant(m)))
	if dlqnotifier.PushPath != pushPath {
		t.Errorf("the dlqnotifier serves push on %q, the resulthandler on %q; the Terraform pushes both to one path", dlqnotifier.PushPath, pushPath)
	}
	outputs, err := os.ReadFile(filepath.Join(terraformDir, "outputs.tf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(outputs), "}"+dlqnotifier.InteractionsPath+`"`) {
		t.Errorf("outputs.tf does not give Slack's request URL as the dlqnotifier's %s", dlqnotifier.InteractionsPath)
	}

	tests := []struct {
		name  string
		edits map[string][2]string
		want  []string
	}{
		{
			name:  "dead-letter policy removed",
			edits: map[string][2]string{"pubsub.tf": {`dead_letter_topic = "gemini-tasks-dlq", push_to = null`, `dead_letter_topic = null, push_to = null`}},
			want:  []string{`"gemini-tasks-worker"`, "no dead_letter_policy"},
		},
		{
			name:  "topic missing",
			edits: map[string][2]string{"pubsub.tf": {`    "genbox-alerts",`, ""}},
			want:  []string{`topic "genbox-alerts": no google_pubsub_topic`},
		},
		{
			name:  "ack deadline differs",
			edits: map[string][2]string{"pubsub.tf": {"ack_deadline_seconds  = 60", "ack_deadline_seconds  = 30"}},
			want:  []string{"ack_deadline_seconds 30"},
		},
		{
			name:  "service agent cannot publish dead letters",
			edits: map[string][2]string{"pubsub.tf": {`for_each = toset(["gemini-tasks-dlq", "gemini-results-dlq"])`, `for_each = toset(["gemini-results-dlq"])`}},
			want:  []string{`lacks roles/pubsub.publisher on dead-letter topic "gemini-tasks-dlq"`},
		},
		{
			name:  "push to the wrong path",
			edits: map[string][2]string{"pubsub.tf": {`push_path = "/pubsub/push"`, `push_path = "/push"`}},
			want:  []string{`pushes to path "/push"`},
		},
		{
			name:  "push consumer not invokable",
			edits: map[string][2]string{"run.tf": {`member   = google_service_account.push.member`, `member   = google_service_account.service["worker"].member`}},
			want:  []string{"grants roles/run.invoker neither to google_service_account.push"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := loadModule(t, brokenCopy(t, tt.edits))
			wantErrors(t, deploycheck.CheckPubSub(m, pubsubWant(m)), tt.want...)
		})
	}
}

// firestoreWant is internal/store's query registry and exemptions.
func firestoreWant(queries []store.Query) deploycheck.FirestoreWant {
	var w deploycheck.FirestoreWant
	for _, q := range queries {
		if !q.Composite() {
			for _, f := range q.Fields {
				w.Queried = append(w.Queried, deploycheck.Field{Collection: q.Collection, Path: f.Path})
			}
			continue
		}
		idx := deploycheck.Index{Query: q.Name, Collection: q.Collection}
		for _, f := range q.Fields {
			idx.Fields = append(idx.Fields, deploycheck.IndexField{Path: f.Path, Order: string(f.Order)})
		}
		w.Composite = append(w.Composite, idx)
	}
	for _, e := range store.Exemptions {
		w.Exempt = append(w.Exempt, deploycheck.Field{Collection: e.Collection, Path: e.Field})
	}
	// expire_at drives Firestore's TTL deletion of finished tasks, cached outputs and done
	// batch jobs.
	w.TTL = []deploycheck.Field{
		{Collection: store.TasksCollection, Path: "expire_at"},
		{Collection: store.OutputsCollection, Path: "expire_at"},
		{Collection: store.BatchJobsCollection, Path: "expire_at"},
		{Collection: store.PreviewsCollection, Path: "expire_at"},
		{Collection: store.ConsoleSessionsCollection, Path: "expire_at"},
		{Collection: store.ConsoleLoginsCollection, Path: "expire_at"},
		{Collection: store.UploadsCollection, Path: "expire_at"},
	}
	return w
}

func TestFirestoreMatchesStoreRegistry(t *testing.T) {
	t.Parallel()
	noErrors(t, deploycheck.CheckFirestore(loadModule(t, terraformDir), firestoreWant(store.Queries)))

	t.Run("composite query without its index", func(t *testing.T) {
		t.Parallel()
		queries := append(slices.Clone(store.Queries), store.Query{
			Name: "by-family", Collection: store.TasksCollection,
			Fields: []store.IndexField{{Path: "family", Order: store.Asc}, {Path: "created_at", Order: store.Desc}},
		})
		wantErrors(t, deploycheck.CheckFirestore(loadModule(t, terraformDir), firestoreWant(queries)),
			`query "by-family" on tasks needs a google_firestore_index`)
	})
	t.Run("index with other orders", func(t *testing.T) {
		t.Parallel()
		queries := append(slices.Clone(store.Queries), store.Query{
			Name: "q", Collection: store.TasksCollection,
			Fields: []store.IndexField{{Path: "family", Order: store.Asc}, {Path: "created_at", Order: store.Desc}},
		})
		dir := brokenCopy(t, map[string][2]string{"firestore.tf": {"locals {", `resource "google_firestore_index" "q" {
  project    = var.project_id
  database   = google_firestore_database.default.name
  collection = "tasks"
  fields {
    field_path = "family"
    order      = "ASCENDING"
  }
  fields {
    field_path = "created_at"
    order      = "ASCENDING"
  }
}

locals {`}})
		wantErrors(t, deploycheck.CheckFirestore(loadModule(t, dir), firestoreWant(queries)),
			`query "q" on tasks needs a google_firestore_index`, "serves no query of the registry")
	})
	t.Run("exemption missing", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"firestore.tf": {`"tasks.input"        = { collection = "tasks", field = "input" }`, ""}})
		wantErrors(t, deploycheck.CheckFirestore(loadModule(t, dir), firestoreWant(store.Queries)), "field tasks.input: the code exempts it")
	})
	t.Run("queried field exempted", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"firestore.tf": {`"tasks.input"        = { collection = "tasks", field = "input" }`, `"tasks.due_at" = { collection = "tasks", field = "due_at" }`}})
		wantErrors(t, deploycheck.CheckFirestore(loadModule(t, dir), firestoreWant(store.Queries)), "field tasks.due_at", "a query filters or orders on it")
	})
	t.Run("TTL missing", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"firestore.tf": {"  ttl_config {}\n", ""}})
		wantErrors(t, deploycheck.CheckFirestore(loadModule(t, dir), firestoreWant(store.Queries)), "no google_firestore_field with a ttl_config")
	})
}

// A service's config loaders, as its run function calls them. Each must call getenv for every
// variable the service reads (COMMON rules); add a service's loader here as its package lands.
type service struct {
	resource string // the address of its Cloud Run resource: TYPE.NAME or TYPE.NAME[KEY]
	load     func(getenv func(string) string) error
}

// workload returns the Cloud Run resource instance at addr (TYPE.NAME or TYPE.NAME[KEY]).
func workload(t *testing.T, m *deploycheck.Module, addr string) *deploycheck.Instance {
	t.Helper()
	typ, rest, _ := strings.Cut(addr, ".")
	name, key, indexed := strings.Cut(strings.TrimSuffix(rest, "]"), "[")
	res := m.Resource(typ, name)
	if res == nil {
		t.Fatalf("no resource %s.%s", typ, name)
	}
	k := cty.NilVal
	if indexed {
		k = cty.StringVal(key)
	}
	in := res.Instance(k)
	if in == nil {
		t.Fatalf("no instance %s", addr)
	}
	return in
}

var services = map[string]service{
	"publisher": {"google_cloud_run_v2_service.http[publisher]", func(getenv func(string) string) error {
		_, err := publisher.Load(getenv)
		_, oerr := obs.ConfigFromEnv(getenv, "publisher")
		return errors.Join(err, oerr)
	}},
	"worker": {"google_cloud_run_v2_worker_pool.worker", func(getenv func(string) string) error {
		_, err := worker.Load(getenv)
		_, oerr := obs.ConfigFromEnv(getenv, "worker")
		return errors.Join(err, oerr)
	}},
	"resulthandler": {"google_cloud_run_v2_service.http[resulthandler]", func(getenv func(string) string) error {
		_, err := resulthandler.FromEnv(getenv) // validates too
		_, oerr := obs.ConfigFromEnv(getenv, "resulthandler")
		return errors.Join(err, oerr)
	}},
	"dlqnotifier": {"google_cloud_run_v2_service.http[dlqnotifier]", func(getenv func(string) string) error {
		_, err := dlqnotifier.Load(getenv) // validates too
		_, oerr := obs.ConfigFromEnv(getenv, "dlqnotifier")
		return errors.Join(err, oerr)
	}},
}

const tuning = "a tuning knob whose code default is the production value"

// adminEmulator is why GENBOX_RUN_ADMIN_EMULATOR_HOST is left unset: deployed, the Cloud Run Admin
// API is Google's.
const adminEmulator = "a fake Cloud Run Admin API for tests and local runs; deployed, the autoscaler calls Google's"

// unauthPush is why GENBOX_UNAUTHENTICATED_PUSH is left unset: a deployed push route verifies
// every push token.
const unauthPush = "local use only (genbox dev, tests): deployed, every push carries an OIDC token that is verified"

// builtInPrompts is why GENBOX_PROMPTS_DIR is left unset: every service that reads it (the
// publisher validates, the worker renders, the dlqnotifier prices) must see the same families.
const builtInPrompts = "the built-in prompt families are embedded in the image; set it for every service or none"

// leftUnset lists, per service, the variables its loaders read that the Terraform leaves unset
// on purpose, with the reason. Every other variable a loader reads must be set on the service's
// Cloud Run resource; an entry here that no loader reads any more is an error too.
var leftUnset = map[string]map[string]string{
	"*": {
		"OTEL_EXPORTER_OTLP_ENDPOINT":         "GENBOX_TELEMETRY=gcp exports to telemetry.googleapis.com; a generic OTLP collector is for other setups",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":  "as OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "as OTEL_EXPORTER_OTLP_ENDPOINT",
	},
	"publisher": {
		"GENBOX_RUN_ADMIN_EMULATOR_HOST": adminEmulator,
		"GENBOX_AUTOSCALE_INTERVAL":      tuning,
		"PORT":                           "set by Cloud Run itself (a reserved name)",
		"GENBOX_PROMPTS_DIR":             builtInPrompts,
		"GENBOX_MAX_BODY_BYTES":          tuning,
		"GENBOX_SECRET_OVERLAP":          tuning,
		"GENBOX_NUDGE_GRACE":             tuning,
		"GENBOX_PUBLISH_TIMEOUT":         tuning,
		"GENBOX_STORE_TIMEOUT":           tuning,
		"GENBOX_LIMITS_TTL":              tuning,
		"GENBOX_TENANT_WAIT_MAX":         "the worker's, which keeps the code default too: the wait of a task created waiting for a slot",
		"GENBOX_EVENTS_PER_TENANT":       tuning,
		"GENBOX_EVENTS_HEARTBEAT":        tuning,
	},
	"dlqnotifier": {
		"GENBOX_RUN_ADMIN_EMULATOR_HOST":  adminEmulator,
		"GENBOX_AUTOSCALE_INTERVAL":       tuning,
		"PORT":                            "set by Cloud Run itself (a reserved name)",
		"GENBOX_UNAUTHENTICATED_PUSH":     unauthPush,
		"GENBOX_PROMPTS_DIR":              builtInPrompts,
		"GENBOX_INSTANCE_ID":              "the default (hostname-pid) names each instance uniquely",
		"GENBOX_SLACK_API_URL":            "Slack's own API; the override is for the Slack double in tests and genbox dev",
		"GENBOX_TASKS_DLQ_SUBSCRIPTION":   "pull mode only; in push mode the subscription names the service, not the reverse (a cycle)",
		"GENBOX_RESULTS_DLQ_SUBSCRIPTION": "pull mode only, as GENBOX_TASKS_DLQ_SUBSCRIPTION",
		"GENBOX_ALERTS_SUBSCRIPTION":      "pull mode only, as GENBOX_TASKS_DLQ_SUBSCRIPTION",
		"GENBOX_ALERT_COOLDOWN":           tuning,
		"GENBOX_SLACK_POST_LEASE":         tuning,
		"GENBOX_SLACK_BACKOFF_BASE":       tuning,
		"GENBOX_SLACK_BACKOFF_MAX":        tuning,
		"GENBOX_DECISION_GRACE":           tuning,
		"GENBOX_SLACK_FLOOD_WINDOW":       tuning,
	},
	"resulthandler": {
		"PORT":                        "set by Cloud Run itself (a reserved name)",
		"GENBOX_INSTANCE_ID":          "the default (hostname-pid) names each instance uniquely",
		"GENBOX_RESULTS_SUBSCRIPTION": "pull mode only; in push mode the subscription names the service, not the reverse (a cycle)",
		"GENBOX_CONCURRENCY":          "pull mode only; push concurrency is the service's max_instance_request_concurrency",
		"GENBOX_WEBHOOK_TIMEOUT":      tuning,
		"GENBOX_DELIVERY_HORIZON":     tuning,
		"GENBOX_DELIVERY_BACKOFF_MIN": tuning,
		"GENBOX_DELIVERY_BACKOFF_MAX": tuning,
		"GENBOX_NOTICE_GRACE":         tuning,
		"GENBOX_TENANT_REFRESH":       tuning,
		"GENBOX_UNAUTHENTICATED_PUSH": unauthPush,
	},
	"worker": {
		"GENBOX_RUN_ADMIN_EMULATOR_HOST":  adminEmulator,
		"GENBOX_AUTOSCALE_INTERVAL":       tuning,
		"GENBOX_AUTOSCALE_HEADROOM":       tuning,
		"GENBOX_AUTOSCALE_DRAIN_TARGET":   tuning,
		"GENBOX_AUTOSCALE_SCALE_IN_AFTER": tuning,
		"GENBOX_AUTOSCALE_IDLE":           tuning,
		"GENBOX_AUTOSCALE_DRAIN_TIMEOUT":  tuning,
		"GENBOX_AUTOSCALE_LATENCY":        tuning,
		"PORT":                            "a worker pool gets no PORT and no traffic; /healthz stays on the default port",
		"GENBOX_INSTANCE_ID":              "the default (hostname-pid) names each instance uniquely",
		"GOOGLE_GEMINI_BASE_URL":          "the genai SDK's endpoint override, for the fake Gemini server in local runs",
		"GENBOX_PROMPTS_DIR":              builtInPrompts,
		"GENBOX_LEASE_TTL":                tuning,
		"GENBOX_LEASE_RENEW":              tuning,
		"GENBOX_RERUN_INTERVAL":           tuning,
		"GENBOX_RERUN_PAGE":               tuning,
		"GENBOX_RERUN_WINDOW":             tuning,
		"GENBOX_MAX_EXTENSION":            tuning,
		"GENBOX_CLAIM_AHEAD":              "derived from GENBOX_CONCURRENCY (the model-call slots)",
		"GENBOX_MAX_IN_FLIGHT":            "derived from GENBOX_CONCURRENCY (the model-call slots)",
		"GENBOX_TASK_ATTEMPTS":            tuning,
		"GENBOX_CLAIM_CAP":                tuning,
		"GENBOX_RETRY_BASE":               tuning,
		"GENBOX_RETRY_MAX":                tuning,
		"GENBOX_PARK_BASE":                tuning,
		"GENBOX_PARK_MAX":                 tuning,
		"GENBOX_NUDGE_GRACE":              tuning,
		"GENBOX_COMMIT_RETRY":             tuning,
		"GENBOX_WEBHOOK_TIMEOUT":          "the resulthandler's, which keeps the code default too: the worker reserves a delivery for one lease of it",
		"GENBOX_SWEEP_INTERVAL":           tuning,
		"GENBOX_SWEEP_LIMIT":              tuning,
		"GENBOX_SWEEP_PACE":               tuning,
		"GENBOX_SWEEP_RELEASE_RATE":       tuning,
		"GENBOX_SWEEP_LEADER_TTL":         tuning,
		"GENBOX_SWEEP_BACKOFF_BASE":       tuning,
		"GENBOX_SWEEP_BACKOFF_MAX":        tuning,
		"GENBOX_MAX_ATTEMPTS":             tuning,
		"GENBOX_MODEL_ATTEMPTS":           tuning,
		"GENBOX_QUALITY_ATTEMPTS":         tuning,
		"GENBOX_BACKOFF_BASE":             tuning,
		"GENBOX_BACKOFF_MAX":              tuning,
		"GENBOX_MAX_RETRY_WAIT":           tuning,
		"GENBOX_CALL_TIMEOUT":             tuning,
		"GENBOX_FLEX_CALL_TIMEOUT":        tuning,
		"GENBOX_FLEX_MARGIN":              tuning,
		"GENBOX_PREVIEW_INTERVAL":         tuning,
		"GENBOX_CONTEXT_CACHE_TTL":        tuning,
		"GENBOX_BATCH_INTERVAL":           tuning,
		"GENBOX_BATCH_MAX_TASKS":          tuning,
		"GENBOX_BATCH_MAX_BYTES":          tuning,
		"GENBOX_BATCH_WAIT":               tuning,
		"GENBOX_BATCH_POLL_MAX":           tuning,
		"GENBOX_BATCH_LEASE_TTL":          tuning,
		"GENBOX_BATCH_LEADER_TTL":         tuning,
		"GENBOX_BATCH_DEADLINE":           tuning,
		"GENBOX_BATCH_MARGIN":             tuning,
		"GENBOX_BATCH_CALL_TIMEOUT":       tuning,
		"GENBOX_RATE_HEADROOM":            tuning,
		"GENBOX_RATE_WINDOW":              "a minute, the period of Gemini's quotas; shorter only in tests",
		"GENBOX_BREAKER_FAILURES":         tuning,
		"GENBOX_BREAKER_MIN_VOLUME":       tuning,
		"GENBOX_BREAKER_WINDOW":           tuning,
		"GENBOX_BREAKER_COOLDOWN":         tuning,
		"GENBOX_BREAKER_FAILURE_RATIO":    tuning,
		"GENBOX_BUDGET_POLICY":            "the default, wait (a soft limit), until an operator chooses fail",
		"GENBOX_BUDGET_RETRY":             tuning,
		"GENBOX_TENANT_REFRESH":           tuning,
		"GENBOX_CACHE_TTL":                tuning,
		"GENBOX_TENANT_WAIT_MAX":          tuning,
	},
}

// readBySDK are variables set on the services for libraries that read the process environment
// themselves, not through a config loader.
var readBySDK = map[string]string{
	"OTEL_TRACES_SAMPLER":     "the OpenTelemetry SDK's tracer provider",
	"OTEL_TRACES_SAMPLER_ARG": "the OpenTelemetry SDK's tracer provider",
}

// placeholder stands for a value known only after apply (a resource attribute, a secret).
const placeholder = "placeholder-known-after-apply-0123456789"

// envValues turns the Terraform environment into what the container would see.
func envValues(t *testing.T, env map[string]deploycheck.EnvVar) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, v := range env {
		if v.Secret != nil || !v.Value.IsWhollyKnown() {
			out[name] = placeholder
			continue
		}
		s, err := convert.Convert(v.Value, cty.String)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = s.AsString()
	}
	return out
}

// checkEnv compares what a loader read with what the Terraform sets.
func checkEnv(svc string, load func(func(string) string) error, env map[string]string) []error {
	var errs []error
	read := map[string]bool{}
	err := load(func(name string) string {
		read[name] = true
		return env[name]
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: the loader rejects the Terraform's values: %w", svc, err))
	}
	unset := maps.Clone(leftUnset["*"])
	maps.Copy(unset, leftUnset[svc])
	for _, name := range slices.Sorted(maps.Keys(read)) {
		_, set := env[name]
		switch {
		case !set && unset[name] == "":
			errs = append(errs, fmt.Errorf("%s reads %s, which its Cloud Run resource does not set", svc, name))
		case set && unset[name] != "":
			errs = append(errs, fmt.Errorf("%s: %s is set, yet listed as left unset (%s)", svc, name, unset[name]))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if !read[name] && readBySDK[name] == "" {
			errs = append(errs, fmt.Errorf("%s: its Cloud Run resource sets %s, which the service never reads", svc, name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(leftUnset[svc])) {
		if !read[name] {
			errs = append(errs, fmt.Errorf("%s: %s is listed as left unset but the service no longer reads it", svc, name))
		}
	}
	return errs
}

func TestCloudRunEnvMatchesConfigLoaders(t *testing.T) {
	t.Parallel()
	m := loadModule(t, terraformDir)
	for _, svc := range []string{"publisher", "worker", "resulthandler", "dlqnotifier"} {
		t.Run(svc, func(t *testing.T) {
			s, ok := services[svc]
			if !ok {
				t.Skipf("%s has no config loader registered in this test yet", svc)
			}
			env, err := deploycheck.CloudRunEnv(workload(t, m, s.resource))
			if err != nil {
				t.Fatal(err)
			}
			noErrors(t, checkEnv(svc, s.load, envValues(t, env)))
		})
	}

	publisherEnv := func(t *testing.T, dir string) map[string]string {
		t.Helper()
		env, err := deploycheck.CloudRunEnv(workload(t, loadModule(t, dir), services["publisher"].resource))
		if err != nil {
			t.Fatal(err)
		}
		return envValues(t, env)
	}
	tests := []struct {
		name string
		edit [2]string
		want []string
	}{
		{"a variable the service reads is missing", [2]string{"    GOOGLE_CLOUD_PROJECT = var.project_id\n", ""},
			[]string{"publisher reads GOOGLE_CLOUD_PROJECT, which its Cloud Run resource does not set"}},
		{"a misspelt variable", [2]string{"GENBOX_PUBLIC_URL = var.publisher_public_url", "GENBOX_PUBLIC_ULR = var.publisher_public_url"},
			[]string{"publisher reads GENBOX_PUBLIC_URL", "sets GENBOX_PUBLIC_ULR, which the service never reads"}},
		{"a value the loader rejects", [2]string{`GENBOX_ALLOW_INSECURE_CALLBACKS = "false"`, `GENBOX_ALLOW_INSECURE_CALLBACKS = "nope"`},
			[]string{"the loader rejects the Terraform's values", "GENBOX_ALLOW_INSECURE_CALLBACKS"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := publisherEnv(t, brokenCopy(t, map[string][2]string{"run.tf": tt.edit}))
			wantErrors(t, checkEnv("publisher", services["publisher"].load, env), tt.want...)
		})
	}
}

// sameEverywhere are variables that must hold one value on every service whose loader reads
// them: the prompt families a task is validated, rendered and priced with, and how a call is
// priced (the worker's max_cost_usd check and the dlqnotifier's Regenerate estimate).
var sameEverywhere = []string{"GENBOX_PROMPTS_DIR", "GENBOX_MODEL_CHAIN", "GENBOX_PRICES"}

// readers returns the services whose loaders read name, sorted.
func readers(name string) []string {
	var out []string
	for _, svc := range slices.Sorted(maps.Keys(services)) {
		read := false
		_ = services[svc].load(func(n string) string { read = read || n == name; return "" })
		if read {
			out = append(out, svc)
		}
	}
	return out
}

// checkSameEverywhere compares, per variable of sameEverywhere, what the Terraform gives each of
// its readers (unset counts as empty).
func checkSameEverywhere(envs map[string]map[string]string) []error {
	var errs []error
	for _, name := range sameEverywhere {
		rs := readers(name)
		if len(rs) < 2 {
			errs = append(errs, fmt.Errorf("%s: read by %v, where sameEverywhere expects several services", name, rs))
			continue
		}
		for _, svc := range rs[1:] {
			if first, v := envs[rs[0]][name], envs[svc][name]; v != first {
				errs = append(errs, fmt.Errorf("%s: %s has %q but %s has %q; every service reading it must agree", name, rs[0], first, svc, v))
			}
		}
	}
	return errs
}

func TestSharedVariablesAgree(t *testing.T) {
	t.Parallel()
	for name, want := range map[string][]string{
		"GENBOX_PROMPTS_DIR": {"dlqnotifier", "publisher", "worker"},
		"GENBOX_MODEL_CHAIN": {"dlqnotifier", "publisher", "worker"},
		"GENBOX_PRICES":      {"dlqnotifier", "publisher", "worker"},
	} {
		if got := readers(name); !slices.Equal(got, want) {
			t.Errorf("%s is read by %v, want %v", name, got, want)
		}
	}
	envsOf := func(t *testing.T, dir string) map[string]map[string]string {
		t.Helper()
		m := loadModule(t, dir)
		out := map[string]map[string]string{}
		for svc, s := range services {
			env, err := deploycheck.CloudRunEnv(workload(t, m, s.resource))
			if err != nil {
				t.Fatal(err)
			}
			out[svc] = envValues(t, env)
		}
		return out
	}
	noErrors(t, checkSameEverywhere(envsOf(t, terraformDir)))

	t.Run("the dlqnotifier prices with another chain", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"run.tf": {"dlqnotifier = merge(local.common_env, local.pricing_env, local.push_env.dlqnotifier, {",
			"dlqnotifier = merge(local.common_env, local.pricing_env, local.push_env.dlqnotifier, {\n      GENBOX_MODEL_CHAIN = \"gemini-2.5-flash-lite\""}})
		wantErrors(t, checkSameEverywhere(envsOf(t, dir)), `GENBOX_MODEL_CHAIN: dlqnotifier has "gemini-2.5-flash-lite" but worker has`)
	})
	t.Run("a prompts directory on the publisher alone", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"run.tf": {`OTEL_SERVICE_NAME = "publisher"`,
			`OTEL_SERVICE_NAME = "publisher"` + "\n      GENBOX_PROMPTS_DIR = \"/etc/genbox/prompts\""}})
		wantErrors(t, checkSameEverywhere(envsOf(t, dir)), `GENBOX_PROMPTS_DIR: dlqnotifier has "" but publisher has "/etc/genbox/prompts"`)
	})
}

func TestSecretsComeFromSecretManager(t *testing.T) {
	t.Parallel()
	m := loadModule(t, terraformDir)
	secretEnv := map[string]bool{"GEMINI_API_KEY": true, "GENBOX_ADMIN_KEY": true, "SLACK_BOT_TOKEN": true, "SLACK_SIGNING_SECRET": true}
	for _, typ := range []string{"google_cloud_run_v2_service", "google_cloud_run_v2_worker_pool"} {
		for _, in := range m.Instances(typ) {
			env, err := deploycheck.CloudRunEnv(in)
			if err != nil {
				t.Fatal(err)
			}
			for name, v := range env {
				if secretEnv[name] && (v.Secret == nil || v.Secret.Type != "google_secret_manager_secret") {
					t.Errorf("%s: %s must come from Secret Manager (value_source.secret_key_ref), not a plain value", in, name)
				}
			}
		}
	}
}

func TestMonitoringUsesObsMetricNames(t *testing.T) {
	t.Parallel()
	known := []string{
		obs.MetricTasks, obs.MetricTaskE2ELatency, obs.MetricGenLatency, obs.MetricTokens, obs.MetricCost,
		obs.MetricCacheHits, obs.MetricRetries, obs.MetricBreakerState, obs.MetricDeadLettersOpen,
		obs.MetricPendingAge, obs.MetricWebhookAttempts, obs.MetricWebhookLatency,
	}
	check := func(m *deploycheck.Module) []error {
		var errs []error
		metrics := m.Locals["metric"]
		if !metrics.IsWhollyKnown() || !metrics.CanIterateElements() {
			return []error{errors.New("local.metric is not a known map of metric names")}
		}
		for it := metrics.ElementIterator(); it.Next(); {
			k, v := it.Element()
			if !slices.Contains(known, v.AsString()) {
				errs = append(errs, fmt.Errorf("local.metric.%s = %q is not a metric internal/obs exports", k.AsString(), v.AsString()))
			}
		}
		return errs
	}
	noErrors(t, check(loadModule(t, terraformDir)))

	// docs/architecture.md §9: alerts on open dead letters, the age of the oldest pending work, the error
	// rate and the cost.
	alerted := func(m *deploycheck.Module) []error {
		alerts := m.Locals["alerts"]
		if !alerts.IsWhollyKnown() || !alerts.CanIterateElements() {
			return []error{errors.New("local.alerts is not a known map of alert definitions")}
		}
		var queries []string
		for it := alerts.ElementIterator(); it.Next(); {
			_, a := it.Element()
			queries = append(queries, a.GetAttr("query").AsString())
		}
		var errs []error
		for _, metric := range []string{obs.MetricDeadLettersOpen, obs.MetricPendingAge, obs.MetricTasks, obs.MetricCost} {
			sel := fmt.Sprintf(`{__name__=%q`, metric)
			if !slices.ContainsFunc(queries, func(q string) bool { return strings.Contains(q, sel) }) {
				errs = append(errs, fmt.Errorf("no alert policy queries %s", metric))
			}
		}
		return errs
	}
	noErrors(t, alerted(loadModule(t, terraformDir)))
	t.Run("an alert missing", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"monitoring.tf": {`query        = "sum(increase({__name__=\"${local.metric.cost}\"}[1d])) > ${var.alert_daily_cost_usd}"`, `query        = "vector(0) > 1"`}})
		wantErrors(t, alerted(loadModule(t, dir)), "no alert policy queries "+obs.MetricCost)
	})
	t.Run("a renamed metric", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"monitoring.tf": {`"genbox.dead_letters.open"`, `"genbox.deadletters.open"`}})
		wantErrors(t, check(loadModule(t, dir)), `"genbox.deadletters.open" is not a metric`)
	})
}

func TestCloudBuildParsesAsBuildMessage(t *testing.T) {
	t.Parallel()
	src, b := readCloudBuild(t, "cloudbuild.yaml")
	noErrors(t, deploycheck.CheckSubstitutions(b))
	_, cb := readCloudBuild(t, "cloudbuild.check.yaml")
	noErrors(t, deploycheck.CheckSubstitutions(cb))

	steps, checkSteps := deploycheck.StepArgs(b), deploycheck.StepArgs(cb)
	has := func(steps []string, parts ...string) bool {
		return slices.ContainsFunc(steps, func(s string) bool {
			for _, p := range parts {
				if !strings.Contains(s, p) {
					return false
				}
			}
			return true
		})
	}
	// The checks run in their own build (under the unprivileged genbox-ci-tests account), which
	// the deploy pipeline waits for before anything else: found by its tag and the commit.
	for _, want := range [][]string{{"gofmt -l"}, {"go vet ./..."}, {"scripts/govulncheck.sh"}, {"scripts/test.sh"}} {
		if !has(checkSteps, want...) {
			t.Errorf("no step of cloudbuild.check.yaml runs %q", want)
		}
		if has(steps, want...) {
			t.Errorf("the deploy pipeline runs %q itself, as the deployer", want)
		}
	}
	if !slices.Contains(cb.GetTags(), "genbox-check") {
		t.Errorf("the check build's tags %v lack genbox-check, which the deploy pipeline waits for", cb.GetTags())
	}
	if !strings.Contains(steps[0], "gcloud builds list") || !strings.Contains(steps[0], "tags=genbox-check") || !strings.Contains(steps[0], "$COMMIT_SHA") {
		t.Errorf("the deploy pipeline's first step does not wait for the check build of its commit: %s", steps[0])
	}
	if !has(steps, "terraform apply", "image_tag=$SHORT_SHA") {
		t.Error("no step runs terraform apply with image_tag=$SHORT_SHA")
	}
	noErrors(t, imageSteps(steps))
	// The checks run on the same Go as the images are built with.
	builder := regexp.MustCompile(`golang:1\.26\.\d+-bookworm`)
	check := builder.FindString(checkSteps[0])
	docker, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if image := builder.FindString(string(docker)); check == "" || check != image {
		t.Errorf("the check step runs on %q, the images build on %q", check, image)
	}

	t.Run("a service built wrongly fails", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct{ old, new, want string }{
			{"SERVICE=publisher,", "SERVICE=worker,", "the step building …/publisher:$SHORT_SHA does not pass --build-arg SERVICE=publisher"},
			{"build, --build-arg, SERVICE=worker,", "build, -f, services/worker/Dockerfile, --build-arg, SERVICE=worker,", "the step building …/worker:$SHORT_SHA builds another Dockerfile than the repository root's"},
			{"push, ", "pull, ", "no step pushes …/publisher:$SHORT_SHA"},
		} {
			if !strings.Contains(string(src), tt.old) {
				t.Fatalf("cloudbuild.yaml no longer contains %q", tt.old)
			}
			b, err := deploycheck.ParseCloudBuild([]byte(strings.Replace(string(src), tt.old, tt.new, 1)))
			if err != nil {
				t.Fatal(err)
			}
			wantErrors(t, imageSteps(deploycheck.StepArgs(b)), tt.want)
		}
	})
	t.Run("a misspelt field fails", func(t *testing.T) {
		t.Parallel()
		for _, src := range []string{
			"steps:\n- name: golang\n  args: [go, test]\n  waitfor: [x]\n",
			"stepz:\n- name: golang\n",
			"steps:\n- name: golang\noptions:\n  logging: CLOUD_LOGS_ONLY\n",
			"steps:\n- name: golang\ntimeout: 1 hour\n",
		} {
			if _, err := deploycheck.ParseCloudBuild([]byte(src)); !errors.Is(err, deploycheck.ErrCloudBuild) {
				t.Errorf("ParseCloudBuild(%q) = %v, want ErrCloudBuild", src, err)
			}
		}
	})
	t.Run("an undeclared substitution fails", func(t *testing.T) {
		t.Parallel()
		b, err := deploycheck.ParseCloudBuild([]byte("substitutions:\n  _REGION: x\n  _UNUSED: unused\nsteps:\n- name: gcr.io/cloud-builders/docker\n  args: [push, \"${_REGION}/$_REPO:$SHORT_SHA\", \"$$HOME\"]\n"))
		if err != nil {
			t.Fatal(err)
		}
		wantErrors(t, deploycheck.CheckSubstitutions(b), "$_REPO is neither built in nor declared", "_UNUSED is declared but never used")
	})
}

// imageSteps checks that Cloud Build builds each service's image from the repository root's
// Dockerfile with --build-arg SERVICE=<service>, and pushes it.
func imageSteps(steps []string) []error {
	var errs []error
	for _, svc := range []string{"publisher", "worker", "resulthandler", "dlqnotifier"} {
		image := "/" + svc + ":$SHORT_SHA"
		at := slices.IndexFunc(steps, func(s string) bool {
			return strings.Contains(s, " build ") && strings.Contains(s, image)
		})
		switch {
		case at < 0:
			errs = append(errs, fmt.Errorf("no step builds …%s", image))
		case !strings.Contains(steps[at], " --build-arg SERVICE="+svc+" "):
			errs = append(errs, fmt.Errorf("the step building …%s does not pass --build-arg SERVICE=%s", image, svc))
		case strings.Contains(steps[at], " -f ") || strings.Contains(steps[at], " --file"):
			errs = append(errs, fmt.Errorf("the step building …%s builds another Dockerfile than the repository root's", image))
		}
		if !slices.ContainsFunc(steps, func(s string) bool { return strings.Contains(s, " push ") && strings.Contains(s, image) }) {
			errs = append(errs, fmt.Errorf("no step pushes …%s", image))
		}
	}
	return errs
}

// TestDockerfile checks the one Dockerfile as built for each service, and that each
// services/<service> it builds is a command.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	good, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range []string{"publisher", "worker", "resulthandler", "dlqnotifier"} {
		t.Run(svc, func(t *testing.T) {
			t.Parallel()
			noErrors(t, deploycheck.CheckDockerfile(good, deploycheck.DockerfileWant{Service: svc, MinGoPatch: minGoPatch}))
			pkg, err := build.ImportDir(filepath.Join(repoRoot, "services", svc), 0)
			if err != nil {
				t.Fatal(err)
			}
			if !pkg.IsCommand() {
				t.Errorf("services/%s is package %s, not a command", svc, pkg.Name)
			}
		})
	}
	t.Run("unsafe images fail", func(t *testing.T) {
		tests := []struct{ svc, old, new, want string }{
			{"worker", "golang:1.26.11-bookworm", "golang:1.26.8-bookworm", "older than 1.26." + strconv.Itoa(minGoPatch)},
			{"worker", "golang:1.26.11-bookworm", "golang:1.26-bookworm", "pinned by exact tag"},
			{"worker", "USER nonroot:nonroot", "USER root", `runs as "root"`},
			{"worker", "static-debian12:nonroot", "static-debian12", "is not gcr.io/distroless/static-*:nonroot"},
			{"worker", "CGO_ENABLED=0 ", "", "CGO_ENABLED=0 is not set"},
			{"worker", "-trimpath ", "", "without -trimpath"},
			{"worker", "go build -trimpath", "go build -tags genbox_crashpoints -trimpath", "genbox_crashpoints"},
			{"worker", "ARG SERVICE\n", "", "declares no ARG SERVICE"},
			{"worker", "ARG SERVICE\n", "ARG SERVICE=worker\n", `ARG SERVICE defaults to "worker"`},
			{"publisher", `"./services/${SERVICE:?set --build-arg SERVICE=<a directory under services/>}"`, "./services/worker", "does not build ./services/publisher"},
			{"worker", `ENTRYPOINT ["/service"]`, "ENTRYPOINT /service", "is not the exec form"},
			{"worker", `ENTRYPOINT ["/service"]`, `ENTRYPOINT ["/worker"]`, "ENTRYPOINT runs /worker, not the binary built"},
			{"worker", "COPY --from=build /out/service /service", "COPY --from=build /src/go.mod /service", "copies no /out/service"},
		}
		for _, tt := range tests {
			if !strings.Contains(string(good), tt.old) {
				t.Fatalf("the Dockerfile no longer contains %q", tt.old)
			}
			bad := strings.Replace(string(good), tt.old, tt.new, 1)
			wantErrors(t, deploycheck.CheckDockerfile([]byte(bad), deploycheck.DockerfileWant{Service: tt.svc, MinGoPatch: minGoPatch}), tt.want)
		}
	})
}

// TestTerraformFormatted is `terraform fmt -check` without the terraform binary: hclwrite.Format
// is the formatter terraform fmt applies.
func TestTerraformFormatted(t *testing.T) {
	t.Parallel()
	for p, src := range terraformFiles(t) {
		if got := hclwrite.Format(src); !bytes.Equal(got, src) {
			t.Errorf("%s is not formatted: run terraform fmt infra/terraform", p)
		}
	}
	if bad := []byte("resource \"x\" \"y\" {\n  a = 1\n  bb = 2\n}\n"); bytes.Equal(hclwrite.Format(bad), bad) {
		t.Error("hclwrite.Format left misaligned attributes alone; this check would pass anything")
	}
}

func TestGeminiBackendChoosesKeyOrVertexRole(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"gemini", "vertex"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			vars := maps.Clone(testVars)
			vars["gemini_backend"] = cty.StringVal(backend)
			m, err := deploycheck.LoadModule(terraformDir, vars)
			if err != nil {
				t.Fatal(err)
			}
			env, err := deploycheck.CloudRunEnv(m.Resource("google_cloud_run_v2_worker_pool", "worker").Instances[0])
			if err != nil {
				t.Fatal(err)
			}
			_, hasKey := env["GEMINI_API_KEY"]
			hasRole := m.Resource("google_project_iam_member", "service").Instance(cty.StringVal("worker/roles/aiplatform.user")) != nil
			if hasKey != (backend == "gemini") || hasRole != (backend == "vertex") {
				t.Errorf("backend %s: worker has GEMINI_API_KEY %v, roles/aiplatform.user %v", backend, hasKey, hasRole)
			}
			if got := envValues(t, env)["GENBOX_GEMINI_BACKEND"]; got != backend {
				t.Errorf("GENBOX_GEMINI_BACKEND = %q, want %q", got, backend)
			}
		})
	}
}

func TestEachServiceRunsAsItsOwnAccountWithNarrowRoles(t *testing.T) {
	t.Parallel()
	// Project-wide roles a genbox service may hold: Firestore has no narrower grant, telemetry
	// is written per project, Vertex AI is called per project. Everything else is granted on
	// the one topic, subscription or secret concerned.
	projectRoles := []string{"roles/datastore.user", "roles/telemetry.tracesWriter", "roles/telemetry.metricsWriter", "roles/aiplatform.user"}
	check := func(m *deploycheck.Module) []error {
		var errs []error
		for _, typ := range []string{"google_cloud_run_v2_service", "google_cloud_run_v2_worker_pool"} {
			for _, in := range m.Instances(typ) {
				tmpl, ok, err := in.Scope().Block("template")
				if err != nil || !ok {
					errs = append(errs, fmt.Errorf("%s: no template", in))
					continue
				}
				svc := in.Resource.Name
				if in.Key.Type() == cty.String {
					svc = in.Key.AsString()
				}
				ref, err := tmpl.Ref("service_account")
				if err != nil || ref.Type != "google_service_account" || ref.Name != "service" ||
					ref.Key.Type() != cty.String || ref.Key.AsString() != svc {
					errs = append(errs, fmt.Errorf("%s does not run as google_service_account.service[%q]", in, svc))
				}
			}
		}
		for _, in := range m.Instances("google_project_iam_member") {
			allowed := projectRoles
			if ref, err := in.Scope().Ref("member"); err == nil && ref.Type == "google_service_account" && ref.Name == "ci_tests" {
				allowed = []string{"roles/logging.logWriter"} // the check builds write their logs, nothing else
			}
			if role, err := in.Scope().String("role"); err != nil || !slices.Contains(allowed, role) {
				errs = append(errs, fmt.Errorf("%s grants %q project-wide", in, role))
			}
		}
		return errs
	}
	noErrors(t, check(loadModule(t, terraformDir)))
	t.Run("a broad role fails", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"iam.tf": {`"roles/datastore.user",`, `"roles/editor",`}})
		wantErrors(t, check(loadModule(t, dir)), `grants "roles/editor" project-wide`)
	})
	t.Run("a role for the check builds beyond their logs fails", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"iam.tf": {`role    = "roles/logging.logWriter"`, `role    = "roles/datastore.user"`}})
		wantErrors(t, check(loadModule(t, dir)), `google_project_iam_member.ci_tests_logs grants "roles/datastore.user" project-wide`)
	})
	t.Run("a shared account fails", func(t *testing.T) {
		t.Parallel()
		dir := brokenCopy(t, map[string][2]string{"run.tf": {`service_account = google_service_account.service["worker"].email`, `service_account = google_service_account.service["publisher"].email`}})
		wantErrors(t, check(loadModule(t, dir)), `google_cloud_run_v2_worker_pool.worker does not run as google_service_account.service["worker"]`)
	})
}

// The worker pool is scaled manually, by the autoscaler alone: Terraform creates it at the
// minimum and leaves the count to it afterwards.
func TestWorkerPoolScaledManually(t *testing.T) {
	t.Parallel()
	check := func(m *deploycheck.Module) error {
		res := m.Resource("google_cloud_run_v2_worker_pool", "worker")
		if res == nil {
			return errors.New("the worker is not a google_cloud_run_v2_worker_pool")
		}
		scaling, ok, err := res.Instances[0].Scope().Block("scaling")
		if err != nil || !ok {
			return errors.New("the worker pool has no scaling block")
		}
		n, err := scaling.Attr("manual_instance_count")
		if err != nil || n.IsNull() || !n.RawEquals(m.Variables["worker_min_instances"]) {
			return fmt.Errorf("manual_instance_count = %#v, want var.worker_min_instances", n)
		}
		for _, a := range []string{"min_instance_count", "max_instance_count", "scaling_mode"} {
			if scaling.Has(a) {
				return fmt.Errorf("the worker pool sets scaling.%s: its instance count must be fixed", a)
			}
		}
		return nil
	}
	if err := check(loadModule(t, terraformDir)); err != nil {
		t.Error(err)
	}
	t.Run("autoscaling fails", func(t *testing.T) {
		dir := brokenCopy(t, map[string][2]string{"run.tf": {"manual_instance_count = var.worker_min_instances", "max_instance_count = var.worker_max_instances"}})
		if err := check(loadModule(t, dir)); err == nil {
			t.Error("a worker pool without manual_instance_count passed")
		}
	})
}

// readCloudBuild reads and parses the repository's Cloud Build file name.
func readCloudBuild(t *testing.T, name string) ([]byte, *cloudbuildpb.Build) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	b, err := deploycheck.ParseCloudBuild(src)
	if err != nil {
		t.Fatal(err)
	}
	return src, b
}
