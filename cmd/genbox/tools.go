package main

import (
	"context"
	"log/slog"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

const envWebhookSecret = "GENBOX_WEBHOOK_SECRET"

func runFakeGemini(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "fakegemini", "[--addr HOST:PORT] [--latency D]",
		`Serves the fake Gemini API (generateContent, streamGenerateContent, countTokens; usage metadata;
Google error JSON) until interrupted, logging every call. Point a genbox worker (or any genai
client) at it with GOOGLE_GEMINI_BASE_URL=http://HOST:PORT and any API key.`)
	addr := fs.String("addr", "127.0.0.1:8084", "listen address (:0 picks a free port)")
	latency := fs.Duration("latency", 0, "how long every generation takes")
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("fakegemini takes no arguments (see --help)")
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	return geminitest.Serve(ctx, *addr, log, geminitest.WithLatency("", geminitest.Fixed(*latency)))
}

func runWebhook(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || args[0] != "listen" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "-help") {
			args = []string{"listen", "--help"}
		} else {
			return usageErr("usage: genbox webhook listen [--addr HOST:PORT] [--secret whsec_...]")
		}
	}
	fs := newFlags(e, "webhook listen", "[--addr HOST:PORT] [--secret whsec_...]",
		`Receives webhooks, verifies each signature (Standard Webhooks) with the secret, and prints each
delivery: 204 for a verified one, 401 (printed with the reason) otherwise. Without a secret it
generates one and prints it, to be set as the tenant's secret.`)
	addr := fs.String("addr", "127.0.0.1:8083", "listen address (:0 picks a free port)")
	secret := fs.String("secret", "", "the tenant's whsec_ signing secret (default $"+envWebhookSecret+"; generated when both are empty)")
	pos, err := parse(e, fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("webhook listen takes no arguments (see --help)")
	}
	if *secret == "" {
		*secret = e.getenv(envWebhookSecret)
	}
	if *secret != "" {
		if _, err := webhook.ParseSecret(*secret); err != nil {
			return usageErr("--secret: %v (a genbox secret looks like whsec_<base64>)", err)
		}
	}
	return webhook.ListenAndPrint(ctx, *addr, *secret, e.stdout)
}
