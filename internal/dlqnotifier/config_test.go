package dlqnotifier

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFromEnv(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		EnvProject: "p", EnvBotToken: "xoxb-1", EnvSigningSecret: "s", EnvChannel: "C1",
		EnvApprovers: " U1, U2 ,,", EnvSlackAPIURL: "http://127.0.0.1:9999/", EnvUnauthPush: "1",
	}
	tests := []struct {
		name    string
		set     map[string]string
		unset   []string
		wantErr []string // variables the error must name
		check   func(t *testing.T, c Config)
	}{
		{name: "defaults", check: func(t *testing.T, c Config) {
			t.Helper()
			if c.Port != 8080 || c.Consumer != ConsumerPush || c.SlackAPIURL != "http://127.0.0.1:9999" || c.ProxyHops != 1 ||
				!slices.Equal(c.Approvers, []string{"U1", "U2"}) || c.AlertCooldown != 30*time.Minute || c.Instance == "" {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "durations", set: map[string]string{EnvAlertCooldown: "2m", EnvPostLease: "5s", EnvConsumer: "pull"}, check: func(t *testing.T, c Config) {
			t.Helper()
			if c.AlertCooldown != 2*time.Minute || c.PostLease != 5*time.Second || c.Consumer != ConsumerPull {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "slack default", unset: []string{EnvSlackAPIURL}, check: func(t *testing.T, c Config) {
			t.Helper()
			if c.SlackAPIURL != "https://slack.com" {
				t.Fatalf("%q", c.SlackAPIURL)
			}
		}},
		{name: "required", unset: []string{EnvProject, EnvBotToken, EnvSigningSecret, EnvChannel, EnvApprovers},
			wantErr: []string{EnvProject, EnvBotToken, EnvSigningSecret, EnvChannel, EnvApprovers}},
		{name: "bad duration", set: map[string]string{EnvAlertCooldown: "soon"}, wantErr: []string{EnvAlertCooldown}},
		{name: "non-positive", set: map[string]string{EnvPostLease: "0s"}, wantErr: []string{EnvPostLease}},
		{name: "backoff order", set: map[string]string{EnvPostBackoffBase: "1m", EnvPostBackoffMax: "1s"}, wantErr: []string{EnvPostBackoffMax}},
		{name: "consumer", set: map[string]string{EnvConsumer: "poll"}, wantErr: []string{EnvConsumer}},
		{name: "proxy hops", set: map[string]string{EnvTrustedProxyHops: "2"}, check: func(t *testing.T, c Config) {
			t.Helper()
			if c.ProxyHops != 2 {
				t.Fatalf("ProxyHops %d, want 2", c.ProxyHops)
			}
		}},
		{name: "bad proxy hops", set: map[string]string{EnvTrustedProxyHops: "-1"}, wantErr: []string{EnvTrustedProxyHops}},
		{name: "slack url", set: map[string]string{EnvSlackAPIURL: "slack.com"}, wantErr: []string{EnvSlackAPIURL}},
		{name: "prices", set: map[string]string{"GENBOX_PRICES": "gemini-2.5-flash=cheap"}, wantErr: []string{"GENBOX_PRICES"}},
		{name: "push needs push auth", set: map[string]string{EnvUnauthPush: ""},
			wantErr: []string{EnvPushAudience, EnvPushAccount, EnvUnauthPush}},
		{name: "push needs both", set: map[string]string{EnvUnauthPush: "", EnvPushAudience: "aud"},
			wantErr: []string{EnvPushAccount}},
		{name: "half push auth in local use", set: map[string]string{EnvPushAccount: "push@p.iam.gserviceaccount.com"},
			wantErr: []string{EnvPushAudience}},
		{name: "push auth", set: map[string]string{EnvUnauthPush: "",
			EnvPushAudience: "aud", EnvPushAccount: "push@p.iam.gserviceaccount.com"}, check: func(t *testing.T, c Config) {
			t.Helper()
			if a := c.PushAuth(); !a.Enabled() || a.Audience != "aud" || a.ServiceAccount != "push@p.iam.gserviceaccount.com" {
				t.Fatalf("%+v", a)
			}
		}},
		{name: "pull needs no push auth", set: map[string]string{EnvUnauthPush: "", EnvConsumer: "pull"}, check: func(t *testing.T, c Config) {
			t.Helper()
			if c.PushAuth().Enabled() || c.UnauthenticatedPush {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "short admin key", set: map[string]string{EnvAdminKey: "short"}, wantErr: []string{EnvAdminKey, "16"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tc.set {
				env[k] = v
			}
			for _, k := range tc.unset {
				delete(env, k)
			}
			c, err := FromEnv(func(k string) string { return env[k] })
			if len(tc.wantErr) > 0 {
				if !errors.Is(err, ErrConfig) {
					t.Fatalf("err %v, want ErrConfig", err)
				}
				for _, v := range tc.wantErr {
					if !strings.Contains(err.Error(), v) {
						t.Errorf("error does not name %s: %v", v, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// FromEnv asks for every variable the service reads (the deploy check compares them with the
// Cloud Run environment).
func TestFromEnvAsksForEveryVariable(t *testing.T) {
	t.Parallel()
	var asked []string
	_, _ = FromEnv(func(k string) string { asked = append(asked, k); return "" })
	for _, v := range []string{EnvPort, EnvProject, EnvBotToken, EnvSigningSecret, EnvChannel, EnvApprovers, EnvSlackAPIURL,
		EnvAdminKey, EnvAlertCooldown, EnvConsumer, EnvInstance, EnvTasksDLQSub, EnvResultsDLQSub, EnvAlertsSub,
		EnvPostLease, EnvPostBackoffBase, EnvPostBackoffMax, EnvFollowUpGrace, EnvShutdownGrace,
		EnvPushAudience, EnvPushAccount, EnvUnauthPush, EnvPromptsDir, EnvTrustedProxyHops, "GENBOX_MODEL_CHAIN", "GENBOX_PRICES"} {
		if !slices.Contains(asked, v) {
			t.Errorf("FromEnv never asked for %s", v)
		}
	}
}
