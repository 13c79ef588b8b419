package geminitest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// post sends body to the fake's route for method, with an API key, and returns the recorded answer.
func post(f *Fake, model, method, body string) *httptest.ResponseRecorder {
	url := "/v1beta/models/" + model + ":" + method
	if method == methodStream {
		url += "?alt=sse"
	}
	req := httptest.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("x-goog-api-key", "k")
	rec := httptest.NewRecorder()
	f.ServeHTTP(rec, req)
	return rec
}

// googleErrorOf decodes a Google error answer, failing the test when it is not one.
func googleErrorOf(t testing.TB, rec *httptest.ResponseRecorder) googleErrorBody {
	t.Helper()
	var e googleError
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code != rec.Code || e.Error.Status == "" || e.Error.Message == "" {
		t.Fatalf("status %d body %q is not a Google error (%v)", rec.Code, rec.Body.String(), err)
	}
	return e.Error
}

func TestProtocolErrors(t *testing.T) {
	t.Parallel()
	f := New()
	t.Cleanup(f.Close)
	tests := []struct {
		name, model, method, body string
		code                      int
	}{
		{"malformed JSON", "m", methodGenerate, `{"contents":`, http.StatusBadRequest},
		{"trailing data", "m", methodGenerate, `{"contents":[{"parts":[{"text":"a"}]}]} {}`, http.StatusBadRequest},
		{"no contents", "m", methodGenerate, `{}`, http.StatusBadRequest},
		{"empty parts", "m", methodGenerate, `{"contents":[{"parts":[]}]}`, http.StatusBadRequest},
		{"bad role", "m", methodGenerate, `{"contents":[{"role":"system","parts":[{"text":"a"}]}]}`, http.StatusBadRequest},
		{"bad mime", "m", methodGenerate, `{"contents":[{"parts":[{"text":"a"}]}],"generationConfig":{"responseMimeType":"text/html"}}`, http.StatusBadRequest},
		{"schema without JSON mime", "m", methodGenerate, `{"contents":[{"parts":[{"text":"a"}]}],"generationConfig":{"responseJsonSchema":{"type":"object"}}}`, http.StatusBadRequest},
		{"unknown method", "m", "embedContent", `{}`, http.StatusNotFound},
		{"malformed countTokens", "m", methodCountTokens, `[`, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := post(f, tt.model, tt.method, tt.body)
			if rec.Code != tt.code {
				t.Fatalf("status %d (%s), want %d", rec.Code, rec.Body.String(), tt.code)
			}
			googleErrorOf(t, rec)
		})
	}
	if l := f.Ledger().Total; l.Calls != 0 || l.CountTokens != 0 {
		t.Errorf("rejected requests reached the ledger: %+v", l)
	}
}

func TestSSEFraming(t *testing.T) {
	t.Parallel()
	f := New()
	t.Cleanup(f.Close)
	rec := post(f, "m", methodStream, `{"contents":[{"parts":[{"text":"stream me"}]}]}`)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	events := strings.Split(strings.TrimSuffix(rec.Body.String(), "\r\n\r\n"), "\r\n\r\n")
	for i, ev := range events {
		data, ok := strings.CutPrefix(ev, "data: ")
		var r map[string]any
		if !ok || json.Unmarshal([]byte(data), &r) != nil {
			t.Fatalf("event %d %q is not `data: <json>`", i, ev)
		}
		if _, has := r["continuationToken"]; has {
			t.Errorf("event %d carries a continuationToken", i)
		}
		if _, has := r["usageMetadata"]; has != (i == len(events)-1) {
			t.Errorf("event %d of %d: usageMetadata present = %v, want only on the last", i, len(events), has)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	seeds := []string{
		`{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`,
		`{"contents":[{"parts":[{"text":"hi"}]}],"systemInstruction":{"parts":[{"text":"sys"}]},"generationConfig":{"temperature":0.5,"maxOutputTokens":3}}`,
		`{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":{"type":"object","properties":{"a":{"$ref":"#"},"b":{"type":"integer","minimum":1e300,"exclusiveMaximum":-5},"c":{"type":"array","minItems":"99999999","items":{"anyOf":[{"type":"null"},{"type":"string","maxLength":-1}]}}},"required":["z"]}}}`,
		`{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"responseMimeType":"application/json","responseSchema":{"type":"OBJECT","properties":{"n":{"type":"NUMBER","minimum":0.5,"maximum":0.25}}}}}`,
		`{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"responseMimeType":"text/x.enum","responseSchema":{"type":"STRING","enum":[1,{"x":[]}]}}}`,
		`{"generateContentRequest":{"contents":[{"parts":[{"text":"count"}]}]}}`,
		`{"contents":`, `null`, `[]`, `{"contents":[{"parts":[{"text":"\ud800"}]}],"generationConfig":{"temperature":"hot"}}`,
	}
	for _, s := range seeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	fake := New()
	f.Cleanup(fake.Close)
	f.Fuzz(func(t *testing.T, body string, count bool) {
		method := methodStream
		if count {
			method = methodCountTokens
		}
		rec := post(fake, "m", method, body)
		_, err := decodeRequest("m", method, []byte(body))
		switch {
		case err == nil && rec.Code != http.StatusOK:
			t.Fatalf("decoded but answered %d: %s", rec.Code, rec.Body.String())
		case err != nil && rec.Code != http.StatusBadRequest:
			t.Fatalf("decode error %v but answered %d", err, rec.Code)
		case err != nil:
			googleErrorOf(t, rec)
		}
	})
}
