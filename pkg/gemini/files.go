package gemini

import (
	"strings"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/task"
)

// File is an input file of a request, sent as a fileData part: on Vertex AI its gs:// URI, on
// the Gemini API the URI of its copy in the Files API. Key identifies its bytes (the object's
// generation and checksums), so that the cache key does not change with the copy's URI.
type File struct {
	URI      string
	MIMEType string
	Size     int64
	Key      string
}

// Modalities of usageMetadata.promptTokensDetails.
const (
	ModalityText     = string(genai.MediaModalityText)
	ModalityImage    = string(genai.MediaModalityImage)
	ModalityAudio    = string(genai.MediaModalityAudio)
	ModalityVideo    = string(genai.MediaModalityVideo)
	ModalityDocument = string(genai.MediaModalityDocument)
)

// contents is the request's one user turn: its files and its prompt, in the family's order.
func contents(req Request) []*genai.Content {
	if len(req.Files) == 0 {
		return genai.Text(req.Prompt)
	}
	parts := make([]*genai.Part, 0, len(req.Files)+1)
	text := genai.NewPartFromText(req.Prompt)
	if req.FilesAfter {
		parts = append(parts, text)
	}
	for _, f := range req.Files {
		parts = append(parts, genai.NewPartFromURI(f.URI, f.MIMEType))
	}
	if !req.FilesAfter {
		parts = append(parts, text)
	}
	return []*genai.Content{genai.NewContentFromParts(parts, genai.RoleUser)}
}

// Modality is the usageMetadata modality a file of mimeType is counted under.
func Modality(mimeType string) string {
	switch {
	case strings.HasPrefix(mimeType, "image/"):
		return ModalityImage
	case strings.HasPrefix(mimeType, "audio/"):
		return ModalityAudio
	case strings.HasPrefix(mimeType, "video/"):
		return ModalityVideo
	case mimeType == "application/pdf":
		return ModalityDocument
	}
	return ModalityText
}

// Bytes per token of a file's estimate, by modality: deliberately low (so the estimate is high)
// for the compact encodings genbox expects — a 16 kbit/s voice recording is about 2 kB a second
// and Gemini counts 32 tokens a second of audio; video counts about 300 tokens a second; a PDF
// page counts 258 tokens and an image at most a few thousand.
const (
	audioBytesPerToken = 60
	videoBytesPerToken = 400
	docBytesPerToken   = 20
	imageMaxTokens     = 4 * 1290
)

// FileTokens is the estimate of what f adds to a prompt, used before a call like EstimateTokens.
func FileTokens(f File) int64 {
	switch Modality(f.MIMEType) {
	case ModalityImage:
		return imageMaxTokens
	case ModalityAudio:
		return f.Size/audioBytesPerToken + 1
	case ModalityVideo:
		return f.Size/videoBytesPerToken + 1
	case ModalityDocument:
		return f.Size/docBytesPerToken + 1
	}
	return (f.Size + 3) / 4
}

// audioTokens is the part of the prompt estimate that is audio, priced at the audio rate.
func audioTokens(req Request) int64 {
	var n int64
	for _, f := range req.Files {
		if Modality(f.MIMEType) == ModalityAudio {
			n += FileTokens(f)
		}
	}
	return n
}

// addModalities records usageMetadata's promptTokensDetails in u by modality.
func addModalities(u *task.Usage, details []*genai.ModalityTokenCount) {
	for _, d := range details {
		if d == nil {
			continue
		}
		n := int64(d.TokenCount)
		switch string(d.Modality) {
		case ModalityImage:
			u.ImageTokens += n
		case ModalityAudio:
			u.AudioTokens += n
		case ModalityVideo:
			u.VideoTokens += n
		case ModalityDocument:
			u.DocumentTokens += n
		}
	}
}
