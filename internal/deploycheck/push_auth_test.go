package deploycheck_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/zclconf/go-cty/cty"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/deploycheck"
)

// pushConsumers maps each push subscription to the service it pushes to.
var pushConsumers = map[string]string{
	bus.SubResults: "resulthandler", bus.SubTasksDLQ: "dlqnotifier", bus.SubResultsDLQ: "dlqnotifier", bus.SubAlerts: "dlqnotifier",
}

// checkPushAudiences reports a push subscription whose OIDC audience is not the
// GENBOX_PUSH_AUDIENCE its service checks, or not among the service's custom_audiences (which
// Cloud Run checks on a private service): either way every push would be refused.
func checkPushAudiences(t *testing.T, m *deploycheck.Module) []error {
	t.Helper()
	var errs []error
	seen := map[string]bool{}
	for _, in := range m.Instances("google_pubsub_subscription") {
		s := in.Scope()
		name, err := s.String("name")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		svc, ok := pushConsumers[name]
		if !ok {
			continue
		}
		seen[name] = true
		push, ok, err := s.Block("push_config")
		if err != nil || !ok {
			errs = append(errs, fmt.Errorf("%s: no push_config (%w)", name, err))
			continue
		}
		oidc, ok, err := push.Block("oidc_token")
		if err != nil || !ok {
			errs = append(errs, fmt.Errorf("%s: no oidc_token (%w)", name, err))
			continue
		}
		aud, err := oidc.String("audience")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		run := workload(t, m, services[svc].resource)
		env, err := deploycheck.CloudRunEnv(run)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if v := env["GENBOX_PUSH_AUDIENCE"].Value; v == cty.NilVal || !v.IsKnown() || v.IsNull() || v.AsString() != aud {
			errs = append(errs, fmt.Errorf("%s pushes with audience %q, but %s's GENBOX_PUSH_AUDIENCE is %#v", name, aud, svc, v))
		}
		custom, err := run.Scope().Attr("custom_audiences")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var list []string
		if custom.IsKnown() && !custom.IsNull() && custom.CanIterateElements() {
			for it := custom.ElementIterator(); it.Next(); {
				if _, v := it.Element(); v.IsKnown() && !v.IsNull() && v.Type() == cty.String {
					list = append(list, v.AsString())
				}
			}
		}
		if !slices.Contains(list, aud) {
			errs = append(errs, fmt.Errorf("%s pushes with audience %q, not among %s's custom_audiences %q", name, aud, svc, list))
		}
	}
	for sub := range pushConsumers {
		if !seen[sub] {
			errs = append(errs, fmt.Errorf("no push subscription %s", sub))
		}
	}
	return errs
}

func TestPushAudiencesMatch(t *testing.T) {
	t.Parallel()
	noErrors(t, checkPushAudiences(t, loadModule(t, terraformDir)))
	tests := []struct {
		name  string
		edits map[string][2]string
		want  []string
	}{
		{
			name:  "service checks another audience",
			edits: map[string][2]string{"run.tf": {"GENBOX_PUSH_AUDIENCE        = audience", `GENBOX_PUSH_AUDIENCE        = svc == "dlqnotifier" ? "genbox-dlqnotifier" : audience`}},
			want:  []string{"gemini-tasks-dlq-dlqnotifier pushes with audience", "GENBOX_PUSH_AUDIENCE"},
		},
		{
			name:  "subscription pushes another audience",
			edits: map[string][2]string{"pubsub.tf": {"audience              = local.push_audience[push_config.value]", `audience              = push_config.value == "resulthandler" ? "genbox-resulthandler" : local.push_audience[push_config.value]`}},
			want:  []string{`gemini-results-resulthandler pushes with audience "genbox-resulthandler"`, "custom_audiences"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantErrors(t, checkPushAudiences(t, loadModule(t, brokenCopy(t, tt.edits))), tt.want...)
		})
	}
}
