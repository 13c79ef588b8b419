package deploycheck

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// PubSubWant is what the code declares about Pub/Sub (internal/bus).
type PubSubWant struct {
	Topics              []string
	Subscriptions       []SubscriptionWant
	AckDeadline         time.Duration
	MaxDeliveryAttempts int
	MinBackoff          time.Duration
	MaxBackoff          time.Duration
	// PushPath is the path every push consumer mounts bus.Push on.
	PushPath string
	// AgentDomain is the e-mail domain of the Pub/Sub service agent, which must be granted
	// publisher on each dead-letter topic and subscriber on each dead-lettering subscription.
	AgentDomain string
}

// SubscriptionWant is one subscription as the code declares it.
type SubscriptionWant struct {
	Name            string
	Topic           string
	DeadLetterTopic string // empty: no dead-letter policy
	// PushTo is the google_cloud_run_v2_service instance pushed to; nil for a pull subscription.
	PushTo *Instance
}

// CheckPubSub compares the module's topics, subscriptions and the Pub/Sub service agent's grants
// with want. It returns every difference.
func CheckPubSub(m *Module, want PubSubWant) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	topics := map[string]*Instance{}
	for _, in := range m.Instances("google_pubsub_topic") {
		name, err := in.Scope().String("name")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		topics[name] = in
	}
	for _, t := range want.Topics {
		if topics[t] == nil {
			fail("topic %q: no google_pubsub_topic", t)
		}
	}
	for _, t := range sortedKeys(topics) {
		if !slices.Contains(want.Topics, t) {
			fail("topic %q (%s) is not declared in the code", t, topics[t])
		}
	}

	subs := map[string]*Instance{}
	for _, in := range m.Instances("google_pubsub_subscription") {
		name, err := in.Scope().String("name")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		subs[name] = in
	}
	wanted := map[string]bool{}
	for _, w := range want.Subscriptions {
		wanted[w.Name] = true
		in := subs[w.Name]
		if in == nil {
			fail("subscription %q: no google_pubsub_subscription", w.Name)
			continue
		}
		errs = append(errs, checkSubscription(m, in, w, want)...)
	}
	for _, name := range sortedKeys(subs) {
		if !wanted[name] {
			fail("subscription %q (%s) is not declared in the code", name, subs[name])
		}
	}
	return errs
}

func checkSubscription(m *Module, in *Instance, w SubscriptionWant, want PubSubWant) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("subscription %q (%s): "+format, append([]any{w.Name, in}, args...)...))
	}
	s := in.Scope()
	if topic, err := topicName(m, s, "topic"); err != nil {
		errs = append(errs, err)
	} else if topic != w.Topic {
		fail("reads topic %q, the code says %q", topic, w.Topic)
	}
	if n, err := number(s, "ack_deadline_seconds"); err != nil {
		errs = append(errs, err)
	} else if time.Duration(n)*time.Second != want.AckDeadline {
		fail("ack_deadline_seconds %d, the code says %s", n, want.AckDeadline)
	}
	if rp, ok, err := s.Block("retry_policy"); err != nil {
		errs = append(errs, err)
	} else if !ok {
		fail("no retry_policy")
	} else {
		for _, b := range []struct {
			attr string
			want time.Duration
		}{{"minimum_backoff", want.MinBackoff}, {"maximum_backoff", want.MaxBackoff}} {
			v, err := rp.String(b.attr)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if d, err := time.ParseDuration(v); err != nil || d != b.want {
				fail("retry_policy.%s %q, the code says %s", b.attr, v, b.want)
			}
		}
	}

	dlp, hasDLP, err := s.Block("dead_letter_policy")
	switch {
	case err != nil:
		errs = append(errs, err)
	case w.DeadLetterTopic == "" && hasDLP:
		fail("has a dead_letter_policy the code does not declare")
	case w.DeadLetterTopic != "" && !hasDLP:
		fail("no dead_letter_policy (the code dead-letters to %q)", w.DeadLetterTopic)
	case hasDLP:
		if topic, err := topicName(m, dlp, "dead_letter_topic"); err != nil {
			errs = append(errs, err)
		} else if topic != w.DeadLetterTopic {
			fail("dead-letters to %q, the code says %q", topic, w.DeadLetterTopic)
		}
		if n, err := number(dlp, "max_delivery_attempts"); err != nil {
			errs = append(errs, err)
		} else if int(n) != want.MaxDeliveryAttempts {
			fail("max_delivery_attempts %d, the code says %d", n, want.MaxDeliveryAttempts)
		}
		errs = append(errs, checkAgentGrants(m, in, w, want.AgentDomain)...)
	}

	push, isPush, err := s.Block("push_config")
	switch {
	case err != nil:
		errs = append(errs, err)
	case w.PushTo == nil && isPush:
		fail("is a push subscription; the code pulls it")
	case w.PushTo != nil && !isPush:
		fail("has no push_config; the code consumes it by push to %s", w.PushTo)
	case isPush:
		errs = append(errs, checkPush(m, in, push, w, want.PushPath)...)
	}
	if exp, ok, err := s.Block("expiration_policy"); err != nil {
		errs = append(errs, err)
	} else if ttl, _ := exp.String("ttl"); !ok || ttl != "" {
		fail(`expiration_policy must be { ttl = "" }: an idle subscription would otherwise be deleted after 31 days`)
	}
	return errs
}

// checkAgentGrants checks the two grants without which dead-lettering silently does nothing.
func checkAgentGrants(m *Module, sub *Instance, w SubscriptionWant, agentDomain string) []error {
	var errs []error
	isAgent := func(s Scope) bool {
		ref, ok := s.Traversal("member")
		if !ok {
			v, err := s.String("member")
			return err == nil && strings.HasSuffix(v, "@"+agentDomain)
		}
		name, isLocal := strings.CutPrefix(ref, "local.")
		return isLocal && strings.Contains(m.LocalSource(name), "@"+agentDomain)
	}
	published := false
	for _, in := range m.Instances("google_pubsub_topic_iam_member") {
		s := in.Scope()
		role, _ := s.String("role")
		if topic, err := topicName(m, s, "topic"); err == nil && topic == w.DeadLetterTopic && role == "roles/pubsub.publisher" && isAgent(s) {
			published = true
		}
	}
	if !published {
		errs = append(errs, fmt.Errorf("subscription %q: the Pub/Sub service agent (@%s) lacks roles/pubsub.publisher on dead-letter topic %q", w.Name, agentDomain, w.DeadLetterTopic))
	}
	subscribed := false
	for _, in := range m.Instances("google_pubsub_subscription_iam_member") {
		s := in.Scope()
		role, _ := s.String("role")
		ref, err := s.Ref("subscription")
		if err == nil && m.Lookup(ref) == sub && role == "roles/pubsub.subscriber" && isAgent(s) {
			subscribed = true
		}
	}
	if !subscribed {
		errs = append(errs, fmt.Errorf("subscription %q: the Pub/Sub service agent (@%s) lacks roles/pubsub.subscriber on it", w.Name, agentDomain))
	}
	return errs
}

func checkPush(m *Module, sub *Instance, push Scope, w SubscriptionWant, path string) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("subscription %q (%s): "+format, append([]any{w.Name, sub}, args...)...))
	}
	a, ok := push.Body.Attributes["push_endpoint"]
	tmpl, isTmpl := a.Expr.(*hclsyntax.TemplateExpr)
	if !ok || !isTmpl || len(tmpl.Parts) < 2 {
		fail(`push_endpoint must be "${%s.uri}%s"`, w.PushTo, path)
		return errs
	}
	ref, err := push.ref(tmpl.Parts[0], "push_endpoint")
	if err != nil || m.Lookup(ref) != w.PushTo || ref.Attr != "uri" {
		fail("push_endpoint does not start with %s.uri", w.PushTo)
	}
	var suffix strings.Builder
	for _, p := range tmpl.Parts[1:] {
		v, diags := p.Value(push.ctx)
		if diags.HasErrors() || !v.IsKnown() {
			fail("push_endpoint path is not a known string")
			return errs
		}
		sv, err := convert.Convert(v, cty.String)
		if err != nil {
			fail("push_endpoint path: %v", err)
			return errs
		}
		suffix.WriteString(sv.AsString())
	}
	if suffix.String() != path {
		fail("pushes to path %q, the services serve %q", suffix.String(), path)
	}
	oidc, ok, err := push.Block("oidc_token")
	if err != nil || !ok {
		fail("push_config has no oidc_token: pushes would be unauthenticated")
		return errs
	}
	saRef, err := oidc.Ref("service_account_email")
	if err != nil {
		fail("oidc_token.service_account_email must reference a google_service_account")
		return errs
	}
	if !invokable(m, w.PushTo, saRef) {
		fail("%s grants roles/run.invoker neither to %s.%s nor to allUsers", w.PushTo, saRef.Type, saRef.Name)
	}
	return errs
}

// invokable reports whether the Cloud Run service grants run.invoker to the service account
// resource sa, or to everyone.
func invokable(m *Module, service *Instance, sa Ref) bool {
	for _, in := range m.Instances("google_cloud_run_v2_service_iam_member") {
		s := in.Scope()
		if role, _ := s.String("role"); role != "roles/run.invoker" {
			continue
		}
		name, err := s.Ref("name")
		if err != nil || m.Lookup(name) != service {
			continue
		}
		if member, err := s.String("member"); err == nil && member == "allUsers" {
			return true
		}
		if ref, err := s.Ref("member"); err == nil && ref.Type == sa.Type && ref.Name == sa.Name {
			return true
		}
	}
	return false
}

// topicName resolves an attribute that references a google_pubsub_topic to the topic's name.
func topicName(m *Module, s Scope, attr string) (string, error) {
	ref, err := s.Ref(attr)
	if err != nil {
		return "", err
	}
	in := m.Lookup(ref)
	if ref.Type != "google_pubsub_topic" || in == nil {
		return "", fmt.Errorf("%s: %s does not reference a declared google_pubsub_topic", s.Instance, attr)
	}
	return in.Scope().String("name")
}

func number(s Scope, attr string) (int64, error) {
	v, err := s.Attr(attr)
	if err != nil {
		return 0, err
	}
	if v.IsNull() || !v.IsKnown() {
		return 0, fmt.Errorf("%s: %s is not set to a known number", s.Instance, attr)
	}
	n, err := convert.Convert(v, cty.Number)
	if err != nil {
		return 0, fmt.Errorf("%s: %s: %w", s.Instance, attr, err)
	}
	i, _ := n.AsBigFloat().Int64()
	return i, nil
}

// Field names one Firestore field of a collection.
type Field struct {
	Collection string
	Path       string
}

// String names the field as collection.path.
func (f Field) String() string { return f.Collection + "." + f.Path }

// IndexField is one field of a composite index: its path and ASCENDING or DESCENDING.
type IndexField struct {
	Path  string
	Order string
}

// Index is a composite index a query needs.
type Index struct {
	Query      string
	Collection string
	Fields     []IndexField
}

// FirestoreWant is what the code declares about Firestore (internal/store).
type FirestoreWant struct {
	// Composite lists the indexes of the registry's composite queries.
	Composite []Index
	// Queried lists the fields of single-field queries: they must keep their automatic index.
	Queried []Field
	// Exempt lists the single-field index exemptions.
	Exempt []Field
	// TTL lists the fields with a TTL policy.
	TTL []Field
}

// CheckFirestore compares the module's google_firestore_index and google_firestore_field
// resources with want. It returns every difference.
func CheckFirestore(m *Module, want FirestoreWant) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	type declared struct {
		in     *Instance
		fields []IndexField
	}
	var indexes []declared
	for _, in := range m.Instances("google_firestore_index") {
		s := in.Scope()
		if scope, _ := s.String("query_scope"); s.Has("query_scope") && scope != "COLLECTION" {
			continue // collection-group indexes serve no registered query
		}
		coll, err := s.String("collection")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		blocks, err := s.Blocks("fields")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d := declared{in: in}
		for _, b := range blocks {
			path, err1 := b.String("field_path")
			order, err2 := b.String("order")
			if err1 != nil || err2 != nil {
				fail("%s: every fields block needs a field_path and an order", in)
				continue
			}
			if path != "__name__" {
				d.fields = append(d.fields, IndexField{Path: coll + "/" + path, Order: order})
			}
		}
		indexes = append(indexes, d)
	}
	used := map[*Instance]bool{}
	for _, q := range want.Composite {
		wantFields := make([]IndexField, len(q.Fields))
		for i, f := range q.Fields {
			wantFields[i] = IndexField{Path: q.Collection + "/" + f.Path, Order: f.Order}
		}
		found := false
		for _, d := range indexes {
			if slices.Equal(d.fields, wantFields) {
				found, used[d.in] = true, true
			}
		}
		if !found {
			fail("query %q on %s needs a google_firestore_index with fields %v", q.Query, q.Collection, q.Fields)
		}
	}
	for _, d := range indexes {
		if !used[d.in] {
			fail("%s serves no query of the registry", d.in)
		}
	}

	exempt := map[Field]*Instance{}
	ttl := map[Field]*Instance{}
	for _, in := range m.Instances("google_firestore_field") {
		s := in.Scope()
		coll, err1 := s.String("collection")
		path, err2 := s.String("field")
		if err1 != nil || err2 != nil {
			fail("%s: collection and field must be known strings", in)
			continue
		}
		f := Field{Collection: coll, Path: path}
		if ic, ok, err := s.Block("index_config"); err != nil {
			errs = append(errs, err)
		} else if ok && len(ic.Body.Attributes) == 0 && len(ic.Body.Blocks) == 0 {
			exempt[f] = in
		}
		if _, ok, err := s.Block("ttl_config"); err != nil {
			errs = append(errs, err)
		} else if ok {
			ttl[f] = in
		}
	}
	for _, f := range want.Exempt {
		if exempt[f] == nil {
			fail("field %s: the code exempts it from indexing; no google_firestore_field with an empty index_config", f)
		}
	}
	for _, f := range sortedFields(exempt) {
		if !slices.Contains(want.Exempt, f) {
			fail("field %s (%s) is exempted from indexing but not in the code's exemptions", f, exempt[f])
		}
		if slices.Contains(want.Queried, f) {
			fail("field %s (%s) is exempted from indexing but a query filters or orders on it", f, exempt[f])
		}
	}
	for _, f := range want.TTL {
		if ttl[f] == nil {
			fail("field %s: no google_firestore_field with a ttl_config", f)
		}
	}
	for _, f := range sortedFields(ttl) {
		if !slices.Contains(want.TTL, f) {
			fail("field %s (%s) has a TTL policy the code does not expect", f, ttl[f])
		}
	}
	return errs
}

// EnvVar is one environment variable of a Cloud Run container.
type EnvVar struct {
	// Value is the plain value (unknown until apply when it depends on a resource).
	Value cty.Value
	// Secret is the referenced google_secret_manager_secret when the value comes from Secret
	// Manager.
	Secret *Ref
}

// CloudRunEnv returns the environment a google_cloud_run_v2_service or
// google_cloud_run_v2_worker_pool instance gives its containers, static and dynamic env blocks
// alike. A name set twice is an error.
func CloudRunEnv(in *Instance) (map[string]EnvVar, error) {
	tmpl, ok, err := in.Scope().Block("template")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s: no template", in)
	}
	containers, err := tmpl.Blocks("containers")
	if err != nil {
		return nil, err
	}
	out := map[string]EnvVar{}
	for _, c := range containers {
		envs, err := c.Blocks("env")
		if err != nil {
			return nil, err
		}
		for _, e := range envs {
			name, err := e.String("name")
			if err != nil {
				return nil, err
			}
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("%s: %s is set twice", in, name)
			}
			v := EnvVar{}
			if src, ok, err := e.Block("value_source"); err != nil {
				return nil, err
			} else if ok {
				ref, ok, err := src.Block("secret_key_ref")
				if err != nil || !ok {
					return nil, fmt.Errorf("%s: %s: value_source without secret_key_ref", in, name)
				}
				secret, err := ref.Ref("secret")
				if err != nil {
					return nil, err
				}
				v.Secret = &secret
			} else if v.Value, err = e.Attr("value"); err != nil {
				return nil, err
			}
			out[name] = v
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedFields(m map[Field]*Instance) []Field {
	out := make([]Field, 0, len(m))
	for f := range m {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
