package publisher

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

func TestFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		EnvPort: "9090", EnvProject: "p", EnvAdminKey: "0123456789abcdef", EnvMaxBodyBytes: "2048",
		EnvAllowInsecureCallbacks: "true", EnvPublicURL: "https://api.example.com", EnvSecretOverlap: "1h",
		EnvPromptsDir: "/etc/prompts", EnvNudgeGrace: "10s", EnvPublishTimeout: "2s", EnvStoreTimeout: "3s", EnvLimitsTTL: "5s", EnvTenantWaitMax: "2m",
		EnvCallbackPorts: "443, 9443", EnvSecretsKey: "projects/p/locations/global/keyRings/r/cryptoKeys/k",
		EnvEventsPerTenant: "3", EnvEventsHeartbeat: "1s", EnvShutdownGrace: "5s", "GENBOX_SWEEP_SHARDS": "4",
		EnvTrustedProxyHops: "2", "GENBOX_MODEL_CHAIN": "m1,m2", "GENBOX_PRICES": "m1=1/2", EnvInputBucket: "in", EnvMaxFiles: "4",
		"GENBOX_AUTOSCALE_POOL": "projects/p/locations/r/workerPools/genbox-worker",
	}
	asked := map[string]bool{}
	c, err := FromEnv(func(k string) string { asked[k] = true; return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Port: 9090, ShutdownGrace: 5 * time.Second, ProjectID: "p", AdminKey: "0123456789abcdef", MaxBodyBytes: 2048, AllowInsecureCallbacks: true,
		PublicURL: "https://api.example.com", SecretOverlap: time.Hour, PromptsDir: "/etc/prompts", NudgeGrace: 10 * time.Second,
		PublishTimeout: 2 * time.Second, StoreTimeout: 3 * time.Second, LimitsTTL: 5 * time.Second, TenantWaitMax: 2 * time.Minute, CallbackPorts: []uint16{443, 9443},
		SecretsKey: "projects/p/locations/global/keyRings/r/cryptoKeys/k", EventsPerTenant: 3, EventsHeartbeat: time.Second, SweepShards: 4,
		ProxyHops: 2, InputBucket: "in", MaxFiles: 4, MaxFileBytes: 2 << 30, UploadRetention: 8 * 24 * time.Hour, Pricing: gemini.Pricing{Models: []string{"m1", "m2"}, DefaultMaxOutputTokens: 8192, Prices: map[string]gemini.Price{
			"m1": {InputPerM: 1, OutputPerM: 2, FlexInputPerM: 0.5, FlexOutputPerM: 1, BatchInputPerM: 0.5, BatchOutputPerM: 1, CachedInputPerM: 0.1,
				AudioInputPerM: 1, FlexAudioInputPerM: 0.5, BatchAudioInputPerM: 0.5}}}}
	if want.Autoscale, err = autoscale.WakeFromEnv(func(k string) string { return env[k] }); err != nil || !want.Autoscale.Enabled() {
		t.Fatalf("the pool to wake: %+v, %v", want.Autoscale, err)
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Fatalf("config (-want +got):\n%s", diff)
	}
	for k := range env {
		if !asked[k] {
			t.Errorf("FromEnv never read %s", k)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	d, err := FromEnv(func(k string) string {
		return map[string]string{EnvProject: "p", EnvSecretsKey: "local:" + strings.Repeat("A", 43) + "="}[k]
	})
	if err != nil || d.Validate() != nil || d.MaxBodyBytes != 1<<20 || d.SecretOverlap != 24*time.Hour || d.Port != 8080 {
		t.Fatalf("defaults %+v: %v", d, err)
	}
	if diff := cmp.Diff([]uint16{443, 8443}, d.CallbackPorts); diff != "" {
		t.Fatalf("default callback ports (-want +got):\n%s", diff)
	}
	a, err := FromEnv(func(k string) string { return map[string]string{EnvProject: "p", EnvCallbackPorts: "any"}[k] })
	if err != nil || a.CallbackPorts != nil {
		t.Fatalf("%s=any: ports %v, %v; want none (every port)", EnvCallbackPorts, a.CallbackPorts, err)
	}
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		name string
	}{
		{map[string]string{}, EnvProject},
		{map[string]string{EnvPort: "x"}, EnvPort},
		{map[string]string{EnvPort: "70000"}, EnvPort},
		{map[string]string{EnvMaxBodyBytes: "12"}, EnvMaxBodyBytes},
		{map[string]string{EnvAdminKey: "short"}, EnvAdminKey},
		{map[string]string{EnvPublicURL: "/relative"}, EnvPublicURL},
		{map[string]string{EnvNudgeGrace: "0s"}, EnvNudgeGrace},
		{map[string]string{EnvLimitsTTL: "soon"}, EnvLimitsTTL},
		{map[string]string{EnvStoreTimeout: "0s"}, EnvStoreTimeout},
		{map[string]string{EnvAllowInsecureCallbacks: "perhaps"}, EnvAllowInsecureCallbacks},
		{map[string]string{EnvCallbackPorts: "443,https"}, EnvCallbackPorts},
		{map[string]string{EnvCallbackPorts: "0"}, EnvCallbackPorts},
		{map[string]string{EnvCallbackPorts: "70000"}, EnvCallbackPorts},
		{map[string]string{EnvSecretsKey: ""}, EnvSecretsKey},
		{map[string]string{EnvSecretsKey: "local:short"}, EnvSecretsKey},
		{map[string]string{EnvSecretsKey: "projects/p/keyRings/r"}, EnvSecretsKey},
		{map[string]string{EnvTrustedProxyHops: "-1"}, EnvTrustedProxyHops},
		{map[string]string{EnvTrustedProxyHops: "two"}, EnvTrustedProxyHops},
	} {
		if _, ok := c.env[EnvProject]; !ok && c.name != EnvProject {
			c.env[EnvProject] = "p"
		}
		cfg, err := FromEnv(func(k string) string { return c.env[k] })
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("env %v: %v, want an error naming %s", c.env, err, c.name)
		}
	}
}
