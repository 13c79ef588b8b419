package gemini

import "github.com/genbox-dev/genbox/pkg/prompts"

// NewRequest builds the Request of a task from its rendered family: prompt, system instruction,
// merged config, response format, validator, quality retry and the family's model chain.
func NewRequest(taskID, tenant string, r *prompts.Rendered) Request {
	return Request{
		TaskID:             taskID,
		Tenant:             tenant,
		Models:             r.Models,
		SystemInstruction:  r.SystemInstruction,
		Prompt:             r.Prompt,
		Config:             r.Config,
		ResponseMIMEType:   r.ResponseMIMEType,
		ResponseJSONSchema: r.ResponseJSONSchema,
		Validate:           r.Validate,
		QualityRetry:       r.QualityRetry,
		FilesAfter:         r.FilePlacement == prompts.FilesAfter,
	}
}

// Chain returns the models req will try, in order: its own chain, else the configured default.
// Resolve it before Fingerprint, so that a change of the default chain changes the cache key.
func (c *Client) Chain(req Request) []string { return c.cfg.chain(req) }
