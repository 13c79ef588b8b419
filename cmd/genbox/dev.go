package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/obs"
)

// readyLine is what `genbox dev` prints once every URL it printed answers.
const readyLine = "genbox dev ready"

func runDev(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "dev", "[flags]",
		`Runs the whole genbox stack locally until interrupted (Ctrl-C or SIGTERM stops everything, and
the emulators it started): the Firestore and Pub/Sub emulators (reused when
FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST are set), the topics and subscriptions, the
publisher, the worker with its sweeper, the resulthandler and the dlqnotifier, the fake Gemini
(unless GEMINI_API_KEY is set), a Slack double with a console page of dead letters, and a webhook
listener for the dev tenant that prints each verified delivery. Callbacks to loopback are allowed
here only.

Environment: GENBOX_DEV_API_KEY (the dev tenant's API key), GENBOX_DEV_WEBHOOK_SECRET (its
whsec_ secret), GENBOX_ADMIN_KEY, SLACK_SIGNING_SECRET — each generated when unset —,
GENBOX_SLACK_APPROVERS (Slack user ids; the console clicks as the first), GOOGLE_CLOUD_PROJECT
(default genbox-dev), GEMINI_API_KEY; every service variable (e.g. GENBOX_RETRY_BASE) passes
through to the services.`)
	cfg, cfgErr := devstack.FromEnv(e.getenv)
	fs.StringVar(&cfg.PublisherAddr, "addr", cfg.PublisherAddr, "the publisher's listen address")
	fs.StringVar(&cfg.DLQAddr, "dlq-addr", cfg.DLQAddr, "the dlqnotifier's listen address (Slack interactions, dead-letter admin)")
	fs.StringVar(&cfg.SlackAddr, "slack-addr", cfg.SlackAddr, "the Slack double's and its console's listen address")
	fs.StringVar(&cfg.WebhookAddr, "webhook-addr", cfg.WebhookAddr, "the dev tenant's webhook listener's address")
	fs.StringVar(&cfg.GeminiAddr, "gemini-addr", cfg.GeminiAddr, "the fake Gemini's listen address")
	readyFile := fs.String("ready-file", "", "also write the URLs and keys as a JSON object to this file once ready")
	verbose := fs.Bool("verbose", false, "print the services' logs (JSON) on stderr")
	emuLog := fs.Bool("emulator-log", false, "print the emulators' output on stderr")
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("dev takes no arguments (see --help)")
	}
	if cfgErr != nil {
		return usageErr("%v", cfgErr)
	}
	if err := cfg.Validate(); err != nil {
		return usageErr("%v", err)
	}
	oc, err := obs.ConfigFromEnv(e.getenv, "genbox-dev")
	if err != nil {
		return usageErr("%v", err)
	}
	oc.Stdout = e.stderr // GENBOX_TELEMETRY=stdout prints spans beside the logs, apart from the URLs
	shutdownTelemetry, err := obs.Setup(context.WithoutCancel(ctx), oc)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	defer func() { // after the stack has stopped: its last spans and metrics are flushed
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTelemetry(flush); err != nil {
			fmt.Fprintln(e.stderr, "genbox dev: telemetry flush:", err)
		}
	}()
	if cfg.Metrics, err = obs.NewMetrics(otel.GetMeterProvider()); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	cfg.Log = obs.NewLogger(e.stderr, level, obs.LogOptions{Project: cfg.Project, LogContent: oc.LogContent})
	cfg.Out = e.stdout
	cfg.Emulators.Getenv = e.getenv
	if *emuLog {
		cfg.Emulators.Log = e.stderr
	}
	fmt.Fprintln(e.stderr, "genbox dev: starting (the emulators take a few seconds)…")
	st, err := devstack.Start(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(e.stderr, "genbox dev: interrupted while starting; stopped")
			return nil
		}
		return fmt.Errorf("dev: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
		defer cancel()
		if cerr := st.Close(sctx); cerr != nil {
			fmt.Fprintln(e.stderr, "genbox dev: shutdown:", cerr)
		}
		fmt.Fprintln(e.stderr, "genbox dev: stopped")
	}()
	printInfo(e.stdout, st.Info)
	if *readyFile != "" {
		if err := writeReadyFile(*readyFile, st.Info); err != nil {
			return err
		}
	}
	fmt.Fprintln(e.stdout, readyLine)
	select {
	case <-ctx.Done():
		fmt.Fprintln(e.stderr, "genbox dev: stopping…")
		return nil
	case err := <-st.Failed():
		return fmt.Errorf("dev: %w", err)
	}
}

func printInfo(w io.Writer, in devstack.Info) {
	emu := "reused"
	if in.EmulatorsStarted {
		emu = "started"
	}
	fmt.Fprintf(w, `genbox dev — project %s
  publisher           %s   (OpenAPI: %s/openapi.json)
  model backend       %s
  console             %s   (logs one browser in; see docs/console.md)
  slack console       %s
  slack interactions  %s
  dead letters admin  %s
  webhook listener    %s   (dev tenant callback_url: %s)
  emulators (%s)  FIRESTORE_EMULATOR_HOST=%s PUBSUB_EMULATOR_HOST=%s
  cloud storage       STORAGE_EMULATOR_HOST=%s   (in-process; uploads go to bucket %s)
`, in.Project, in.Publisher, in.Publisher, in.ModelBackend, in.Console, in.SlackConsole, in.SlackInteractions, in.DLQ,
		in.WebhookListener, in.WebhookURL, emu, in.FirestoreHost, in.PubSubHost, in.StorageHost, devstack.DevInputBucket)
	for _, name := range in.Generated {
		fmt.Fprintf(w, "  generated %s (set it to keep it across runs)\n", name)
	}
	fmt.Fprintf(w, `
In another terminal:
  export %s=%s %s=%s %s=%s
  export %s=%s %s=%s
  genbox submit --family summarize --input "genbox runs Gemini tasks and never pays twice." --wait
`, envURL, in.Publisher, envAPIKey, in.APIKey, envCallbackURL, in.WebhookURL, envAdminKey, in.AdminKey, envDLQURL, in.DLQ)
}

// writeReadyFile writes info as JSON, atomically (a script polling the file never reads half of it).
func writeReadyFile(path string, info devstack.Info) error {
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".genbox-ready-*")
	if err != nil {
		return fmt.Errorf("--ready-file: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("--ready-file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("--ready-file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("--ready-file: %w", err)
	}
	return nil
}
