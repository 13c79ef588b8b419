// Package obs holds the cross-service observability tests of issue 9: the whole stack in one
// process (internal/devstack) with in-memory telemetry (internal/obs/obstest) shows one trace per
// task from the REST call to the webhook POST, metrics that match what the fake Gemini billed,
// and logs that never hold prompts, outputs or secrets.
package obs
