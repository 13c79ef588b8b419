package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/genbox-dev/genbox/pkg/task"
)

const adminSynopsis = `tenant create ID [limits] | tenant get ID | tenant limits ID [limits]
       | key create TENANT | key revoke KEY_ID | secret rotate TENANT`

const adminDescription = `Administers tenants, API keys and webhook secrets with the admin key (GENBOX_ADMIN_KEY), and
prints the answer (--json: as JSON). A created tenant's first webhook secret, a created API key
and a rotated secret are shown once, in the answer: keep them.`

func runAdmin(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "admin", adminSynopsis, adminDescription)
	var api apiFlags
	api.register(fs, e, envAdminKey)
	var lim task.Limits
	fs.IntVar(&lim.Concurrency, "concurrency", 0, "tenant create/limits: tasks running at once across every worker instance (0: no limit)")
	fs.IntVar(&lim.Weight, "weight", 0, "tenant create/limits: the tenant's part of the pool's slots when tenants contend for them (0: 1)")
	fs.Float64Var(&lim.SubmitRate, "submit-rate", 0, "tenant create/limits: submissions per second (0: no limit)")
	fs.IntVar(&lim.SubmitBurst, "submit-burst", 0, "tenant create/limits: submissions at once above the rate")
	fs.Float64Var(&lim.DailyBudgetUSD, "daily-budget", 0, "tenant create/limits: soft daily spending limit in USD (0: the deployment's default, GENBOX_DEFAULT_DAILY_BUDGET_USD)")
	fs.Int64Var(&lim.RPM, "rpm", 0, "tenant create/limits: model calls per minute across every worker instance (0: no limit)")
	fs.Int64Var(&lim.TPM, "tpm", 0, "tenant create/limits: model tokens per minute across every worker instance (0: no limit)")
	var buckets pathsFlag
	fs.Var(&buckets, "allowed-bucket", "tenant create/limits: a Cloud Storage bucket the tenant's tasks may name by gs:// URI (repeatable)")
	output := formatFlags(fs)
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 3 {
		return usageErr("admin takes an object, an action and an id: genbox admin %s", adminSynopsis)
	}
	obj, action, id := pos[0], pos[1], pos[2]
	c, err := api.client(envAdminKey)
	if err != nil {
		return err
	}
	limitsSet := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "concurrency", "weight", "submit-rate", "submit-burst", "daily-budget", "rpm", "tpm", "allowed-bucket":
			limitsSet = true
		}
	})
	lim.AllowedBuckets = buckets
	var answer func() error
	switch obj + " " + action {
	case "tenant create", "tenant get", "tenant limits":
		var t *task.Tenant
		switch action {
		case "create":
			var l *task.Limits
			if limitsSet {
				l = &lim
			}
			t, err = c.CreateTenant(ctx, id, l)
		case "get":
			t, err = c.GetTenant(ctx, id)
		default:
			if !limitsSet {
				return usageErr("tenant limits needs at least one of --concurrency, --weight, --submit-rate, --submit-burst, --daily-budget, --rpm, --tpm, --allowed-bucket")
			}
			t, err = c.SetLimits(ctx, id, lim)
		}
		answer = func() error { return showTenant(e.stdout, output.asJSON(e.stdout), t) }
	case "key create", "key revoke":
		var k *task.APIKey
		if action == "create" {
			k, err = c.CreateAPIKey(ctx, id)
		} else {
			k, err = c.RevokeAPIKey(ctx, id)
		}
		answer = func() error { return showAPIKey(e.stdout, output.asJSON(e.stdout), k) }
	case "secret rotate":
		var r *task.RotatedSecret
		r, err = c.RotateWebhookSecret(ctx, id)
		answer = func() error { return showRotated(e.stdout, output.asJSON(e.stdout), r) }
	default:
		return usageErr("unknown admin action %q: genbox admin %s", obj+" "+action, adminSynopsis)
	}
	if err != nil {
		return fmt.Errorf("admin %s %s %s: %w", obj, action, id, err)
	}
	return answer()
}
