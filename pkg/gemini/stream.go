package gemini

import (
	"context"
	"strings"

	"google.golang.org/genai"
)

// generateContent makes the model call of req: generateContent, or streamGenerateContent when
// req.OnPartial is set, whose chunks are folded into one response as generateContent would
// have answered (the text of every chunk, the last chunk's finish reason and usage, the prompt
// feedback of any), so that what follows — usage, billing, the blocked check — is the same.
func (c *Client) generateContent(ctx context.Context, model string, req Request, gc *genai.GenerateContentConfig) (*genai.GenerateContentResponse, error) {
	if req.OnPartial == nil {
		return c.models.GenerateContent(ctx, model, contents(req), gc)
	}
	var text strings.Builder
	var last *genai.GenerateContentResponse
	var feedback *genai.GenerateContentResponsePromptFeedback
	for chunk, err := range c.models.GenerateContentStream(ctx, model, contents(req), gc) {
		if err != nil {
			return nil, err
		}
		last = chunk
		if chunk.PromptFeedback != nil {
			feedback = chunk.PromptFeedback
		}
		if t := chunk.Text(); t != "" {
			text.WriteString(t)
			req.OnPartial(text.String())
		}
	}
	if last == nil {
		return &genai.GenerateContentResponse{}, nil
	}
	out := *last
	out.PromptFeedback = feedback
	if len(last.Candidates) > 0 {
		cand := *last.Candidates[0]
		cand.Content = genai.NewContentFromText(text.String(), genai.RoleModel)
		out.Candidates = []*genai.Candidate{&cand}
	}
	return &out, nil
}
