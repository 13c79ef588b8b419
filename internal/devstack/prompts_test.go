package devstack

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A family that exists only in GENBOX_PROMPTS_DIR is accepted by the publisher, rendered by the
// worker with that directory's system instruction, template and model, and succeeds with its
// webhook: every service of the stack reads the one directory.
func TestPromptsDirFamilyEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	family := `family: headline
version: "2027-01-01"
models: [m-headline]
system: You write headlines.
template: "Write one headline for: {{.Input}}"
validate: {min_chars: 1}
variants:
  default: {}
`
	if err := os.WriteFile(filepath.Join(dir, "headline.yaml"), []byte(family), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := setup(t, "GENBOX_PROMPTS_DIR", dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	marker := "memo-" + s.Info.Project // the fake's ledger finds the task's bills by its prompt
	v := s.SubmitWait(t, ctx, task.Request{Family: "headline", Input: "The " + marker + " announces a merger."})
	if v.State != task.StateSucceeded || v.Output == nil {
		t.Fatalf("task ended %s (output %v, error %+v)", v.State, v.Output, v.Error)
	}
	bills := s.Fake.Ledger().BillsFor(marker)
	if len(bills) != 1 {
		t.Fatalf("task billed %d times, want 1", len(bills))
	}
	if r := bills[0].Request; r.Model != "m-headline" || r.SystemInstruction != "You write headlines." ||
		!strings.HasPrefix(r.Prompt, "Write one headline for: The "+marker) {
		t.Errorf("the model was called with %q, system %q, prompt %q; want the directory's family", r.Model, r.SystemInstruction, r.Prompt)
	}
	if _, err := s.Inbox.Wait(ctx, func(d doubles.Hook) bool {
		return d.ID == task.EventID(v.TaskID, task.EventSucceeded, 0)
	}); err != nil {
		t.Errorf("no task.succeeded webhook: %v", err)
	}
}
