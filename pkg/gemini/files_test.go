package gemini_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// A file copied to the Files API reaches the model byte for byte as a fileData part, its tokens
// are reported by modality, and audio is billed at the audio rate.
func TestFilesReachTheModel(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) {
		prices, err := gemini.ParsePrices(primary + "=1/2;audio=3," + fallback + "=0.5/1")
		if err != nil {
			t.Fatal(err)
		}
		c.Prices = prices
	})
	ctx := context.Background()
	audio := bytes.Repeat([]byte("RIFF-fake-wave-"), 400)
	pdf := []byte("%PDF-1.7 a small document")
	var files []gemini.File
	for _, f := range []struct {
		name, mime string
		data       []byte
	}{{"gb-audio", "audio/wav", audio}, {"gb-doc", "application/pdf", pdf}} {
		c, err := b.client.CopyFile(ctx, f.name, f.mime, int64(len(f.data)), bytes.NewReader(f.data))
		if err != nil {
			t.Fatal(err)
		}
		if c.Name != "files/"+f.name || c.URI == "" || c.ExpireAt.IsZero() {
			t.Fatalf("copy %+v: want files/%s with a URI and an expiry", c, f.name)
		}
		files = append(files, gemini.File{URI: c.URI, MIMEType: f.mime, Size: int64(len(f.data)), Key: f.name})
	}
	// A second CopyFile of the same name adopts the first: no second upload.
	if _, err := b.client.CopyFile(ctx, "gb-doc", "application/pdf", int64(len(pdf)), strings.NewReader("not read")); err != nil {
		t.Fatal(err)
	}
	if n := len(b.srv.Files()); n != 2 {
		t.Fatalf("%d files uploaded, want 2 (the repeated copy adopted)", n)
	}

	req := request("files")
	req.Files = files
	res, err := b.client.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	bills := b.srv.Ledger().Bills
	if len(bills) != 1 {
		t.Fatalf("%d bills, want 1", len(bills))
	}
	var got []string
	for _, f := range bills[0].Request.Files {
		got = append(got, f.MIMEType+" "+f.SHA256)
	}
	want := []string{"audio/wav " + digest(audio), "application/pdf " + digest(pdf)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("files the model read (-want +got):\n%s", diff)
	}
	if !strings.Contains(res.Text, digest(pdf)) {
		t.Errorf("answer %q does not echo the document's digest", res.Text)
	}
	u := res.Usage
	if u.AudioTokens != int64(len(audio))/32 || u.DocumentTokens != 1 {
		t.Errorf("usage %+v: want audio %d and document 1 tokens", u, len(audio)/32)
	}
	if want := float64((u.PromptTokens-u.AudioTokens)*1+u.AudioTokens*3+u.OutputTokens*2) / 1e6; math.Abs(res.CostUSD-want) > 1e-12 {
		t.Errorf("cost %g, want %g (audio at 3/M, the rest at 1/M, output at 2/M)", res.CostUSD, want)
	}

	for _, f := range files {
		if err := b.client.DeleteFile(ctx, "files/"+f.Key); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.client.Generate(ctx, req); gemini.ClassOf(err) != gemini.Permanent {
		t.Fatalf("a call naming deleted files: %v, want a permanent error", err)
	}
	if err := b.client.DeleteFile(ctx, "files/gb-doc"); err != nil {
		t.Fatalf("deleting a deleted file: %v, want no error", err)
	}
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// A file-bearing request's worst case counts its files from their size and modality, audio at
// the audio price: what max_cost_usd and the budgets reserve before the call.
func TestEstimateCountsFiles(t *testing.T) {
	t.Parallel()
	p := gemini.Pricing{Models: []string{"m"}, Prices: map[string]gemini.Price{"m": {InputPerM: 1, OutputPerM: 2, AudioInputPerM: 3}}, DefaultMaxOutputTokens: 100}
	text := gemini.Request{Prompt: strings.Repeat("x", 400)}
	_, base := p.Estimate(text)
	withAudio := text
	withAudio.Files = []gemini.File{{MIMEType: "audio/wav", Size: 600_000}}
	_, audio := p.Estimate(withAudio)
	withDoc := text
	withDoc.Files = []gemini.File{{MIMEType: "application/pdf", Size: 200_000}}
	_, doc := p.Estimate(withDoc)
	// 600 kB of audio: 10,001 tokens at 3/M; 200 kB of PDF: 10,001 tokens at 1/M.
	if want := base + 10_001*3/1e6; math.Abs(audio-want) > 1e-12 {
		t.Errorf("estimate with audio %g, want %g", audio, want)
	}
	if want := base + 10_001*1/1e6; math.Abs(doc-want) > 1e-12 {
		t.Errorf("estimate with a PDF %g, want %g", doc, want)
	}
}
