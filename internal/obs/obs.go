// Package obs owns genbox's observability plumbing, shared by every service: the JSON logger in
// Cloud Logging's shape (trace ids, task_id on every line of a task, content and secrets redacted),
// the OpenTelemetry tracer and meter providers and their exporters, the global W3C propagator that
// carries one trace across Pub/Sub, the HTTP server spans, and every metric instrument with its
// stable name (Metrics).
//
// A service adopts it in four lines:
//
//	oc, err := obs.ConfigFromEnv(getenv, "worker") // inside the service's own ConfigFromEnv
//	log := oc.Logger(stdout)
//	shutdown, err := obs.Setup(ctx, oc)            // defer shutdown(ctx) with errors.Join
//	m, err := obs.NewMetrics(otel.GetMeterProvider())
//
// then logs with log.InfoContext(obs.WithTask(ctx, id), ...), wraps its mux in obs.Handler and
// calls m.TaskFinished, m.Generation, ... (a nil *Metrics does nothing).
package obs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/detectors/gcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/oauth"

	"github.com/genbox-dev/genbox/internal/envconfig"
)

// Exporter says where telemetry goes.
type Exporter string

// Exporters.
const (
	// ExportNone keeps the global no-op providers: spans still carry trace context across
	// services (the propagator is set), nothing is exported. The local default.
	ExportNone Exporter = "none"
	// ExportOTLP sends OTLP over gRPC where the standard OTEL_EXPORTER_OTLP_* variables say; the
	// exporters read those variables (endpoint, headers, timeout, insecure, ...) themselves.
	ExportOTLP Exporter = "otlp"
	// ExportGCP sends OTLP over gRPC to Google's Telemetry API (telemetry.googleapis.com:443) with
	// Application Default Credentials and the GCP resource detector, as opentelemetry-operations-go's
	// MIGRATION.md prescribes in place of its deprecated exporters.
	ExportGCP Exporter = "gcp"
	// ExportStdout writes spans as JSON to Config.Stdout (metrics are not exported).
	ExportStdout Exporter = "stdout"
)

// GCPEndpoint is Google's OTLP ingestion endpoint for Cloud Trace and Cloud Monitoring.
const GCPEndpoint = "telemetry.googleapis.com:443"

// GCPScopes are the OAuth scopes of the Application Default Credentials used with ExportGCP.
var GCPScopes = []string{
	"https://www.googleapis.com/auth/cloud-platform",
	"https://www.googleapis.com/auth/trace.append",
}

// Config is a service's observability configuration.
type Config struct {
	// ServiceName is the service.name resource attribute: OTEL_SERVICE_NAME, else the service's own.
	ServiceName string
	// Exporter is GENBOX_TELEMETRY (none, otlp, gcp, stdout). Unset, it is otlp when
	// OTEL_EXPORTER_OTLP_ENDPOINT or its _TRACES_/_METRICS_ variant is set, else none.
	Exporter Exporter
	// Project is GOOGLE_CLOUD_PROJECT: the project of log trace links and of exported telemetry.
	Project string
	// LogLevel is GENBOX_LOG_LEVEL (debug, info, warn, error; default info).
	LogLevel slog.Level
	// LogContent is GENBOX_LOG_CONTENT: true logs prompts, outputs and secrets. Default false.
	LogContent bool
	// Stdout receives the spans of ExportStdout; nil means os.Stdout.
	Stdout io.Writer
}

// ConfigFromEnv reads the observability configuration; service is the default service name. It
// calls getenv for every variable it knows, including the OTLP endpoints it only checks for
// presence (the exporters read them from the process environment).
func ConfigFromEnv(getenv func(string) string, service string) (Config, error) {
	c := Config{ServiceName: service}
	r := envconfig.New(getenv)
	var exporter string
	r.String("GENBOX_TELEMETRY", &exporter)
	c.Exporter = Exporter(strings.ToLower(exporter))
	r.String("GOOGLE_CLOUD_PROJECT", &c.Project)
	r.String("OTEL_SERVICE_NAME", &c.ServiceName)
	endpoint := false
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		r.Func(name, func(string) error { endpoint = true; return nil })
	}
	if c.Exporter == "" {
		c.Exporter = ExportNone
		if endpoint {
			c.Exporter = ExportOTLP
		}
	}
	r.Func("GENBOX_LOG_LEVEL", func(s string) error { return c.LogLevel.UnmarshalText([]byte(s)) })
	r.Bool("GENBOX_LOG_CONTENT", &c.LogContent)
	if err := r.Err(); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Validate reports a configuration that cannot work, naming the variable to fix.
func (c Config) Validate() error {
	switch c.Exporter {
	case ExportNone, ExportOTLP, ExportStdout:
	case ExportGCP:
		if c.Project == "" {
			return errors.New("GOOGLE_CLOUD_PROJECT must be set when GENBOX_TELEMETRY=gcp")
		}
	default:
		return fmt.Errorf("GENBOX_TELEMETRY: %q is not one of none, otlp, gcp, stdout", c.Exporter)
	}
	if c.ServiceName == "" {
		return errors.New("OTEL_SERVICE_NAME: no service name")
	}
	return nil
}

// Logger returns NewLogger(w, c.LogLevel, ...) with the configuration's project and content switch.
func (c Config) Logger(w io.Writer) *slog.Logger {
	return NewLogger(w, c.LogLevel, LogOptions{Project: c.Project, LogContent: c.LogContent})
}

// Setup installs the W3C TraceContext and Baggage propagator globally and, unless c.Exporter is
// ExportNone, global tracer and meter providers exporting where c says. The returned shutdown
// flushes and stops both providers; call it once, with a budget inside the grace period.
func Setup(ctx context.Context, c Config) (shutdown func(context.Context) error, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if c.Exporter == ExportNone {
		return func(context.Context) error { return nil }, nil
	}
	res, err := newResource(ctx, c)
	if err != nil {
		return nil, err
	}
	spans, readers, err := exporters(ctx, c)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(spans))
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	for _, r := range readers {
		opts = append(opts, sdkmetric.WithReader(r))
	}
	mp := sdkmetric.NewMeterProvider(opts...)
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	return func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}, nil
}

func newResource(ctx context.Context, c Config) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", c.ServiceName)}
	opts := []resource.Option{resource.WithTelemetrySDK(), resource.WithFromEnv()}
	if c.Exporter == ExportGCP {
		attrs = append(attrs, attribute.String("gcp.project_id", c.Project))
		opts = append(opts, resource.WithDetectors(gcp.NewDetector()))
	}
	res, err := resource.New(ctx, append(opts, resource.WithAttributes(attrs...))...)
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	// A partial resource (a detector that found nothing off Google Cloud) is still usable.
	return res, nil
}

// exporters builds the span exporter and the metric readers of c.Exporter.
func exporters(ctx context.Context, c Config) (sdktrace.SpanExporter, []sdkmetric.Reader, error) {
	switch c.Exporter {
	case ExportStdout:
		w := c.Stdout
		if w == nil {
			w = os.Stdout
		}
		se, err := stdouttrace.New(stdouttrace.WithWriter(w))
		if err != nil {
			return nil, nil, fmt.Errorf("stdout trace exporter: %w", err)
		}
		return se, nil, nil
	case ExportGCP:
		creds, err := oauth.NewApplicationDefault(ctx, GCPScopes...)
		if err != nil {
			return nil, nil, fmt.Errorf("GENBOX_TELEMETRY=gcp: application default credentials: %w", err)
		}
		se, err := otlptracegrpc.New(ctx,
			otlptracegrpc.WithEndpoint(GCPEndpoint),
			otlptracegrpc.WithDialOption(grpc.WithPerRPCCredentials(creds)))
		if err != nil {
			return nil, nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		me, err := otlpmetricgrpc.New(ctx,
			otlpmetricgrpc.WithEndpoint(GCPEndpoint),
			otlpmetricgrpc.WithDialOption(grpc.WithPerRPCCredentials(creds)))
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("otlp metric exporter: %w", err), se.Shutdown(ctx))
		}
		return se, []sdkmetric.Reader{sdkmetric.NewPeriodicReader(me)}, nil
	default: // ExportOTLP
		se, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		me, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("otlp metric exporter: %w", err), se.Shutdown(ctx))
		}
		return se, []sdkmetric.Reader{sdkmetric.NewPeriodicReader(me)}, nil
	}
}
