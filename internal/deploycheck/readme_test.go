package deploycheck_test

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestReadmeListsEveryVariable holds README.md to the code: every environment variable a
// service's config loader reads is named there, so the documented configuration cannot drift.
func TestReadmeListsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	read := map[string][]string{}
	for svc, s := range services {
		_ = s.load(func(name string) string {
			if !slices.Contains(read[name], svc) {
				read[name] = append(read[name], svc)
			}
			return ""
		})
	}
	if len(read) == 0 {
		t.Fatal("the loaders read no variable: the recorder is broken")
	}
	for _, name := range slices.Sorted(maps.Keys(read)) {
		if !strings.Contains(string(readme), "`"+name+"`") {
			slices.Sort(read[name])
			t.Errorf("README.md does not document `%s` (read by %s)", name, strings.Join(read[name], ", "))
		}
	}
}
