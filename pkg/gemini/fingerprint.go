package gemini

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Fingerprint is the cache key of a generation (outputs/{fingerprint}): a SHA-256 over the tenant
// and everything that shapes the output — the model chain, the prompt version, the rendered
// prompt, the system instruction, the whole generation config, the response format and the
// input files (their objects' generations and checksums, File.Key). Two
// tenants never share a fingerprint, so no tenant can see another's output or cost. req.Models
// should be the resolved chain (Client.Chain).
func Fingerprint(tenant string, req Request, promptVersion string) string {
	// A JSON array keeps field boundaries unambiguous; map keys (in the schema) are sorted.
	schema, err := json.Marshal(req.ResponseJSONSchema)
	if err != nil {
		// An unencodable schema cannot be sent either; keep the key distinct rather than shared.
		schema = []byte(err.Error())
	}
	b, _ := json.Marshal([]any{
		"genbox-fingerprint-v1",
		tenant,
		req.Models,
		promptVersion,
		req.Prompt,
		req.SystemInstruction,
		genConfigKey(req.Config),
		req.ResponseMIMEType,
		string(schema),
		fileKeys(req),
	})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// fileKeys are the keys of req's files and where they go; nil without files, so that a text
// request keeps its fingerprint.
func fileKeys(req Request) []string {
	if len(req.Files) == 0 {
		return nil
	}
	keys := make([]string, 0, len(req.Files)+1)
	if req.FilesAfter {
		keys = append(keys, "files-after")
	}
	for _, f := range req.Files {
		keys = append(keys, f.Key)
	}
	return keys
}

// genConfigKey spells every field, set or not, so that an unset field and a zero differ.
func genConfigKey(c task.GenConfig) []any {
	return []any{c.Temperature, c.TopP, c.TopK, c.MaxOutputTokens}
}
