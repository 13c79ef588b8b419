package deploycheck

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"cloud.google.com/go/cloudbuild/apiv1/v2/cloudbuildpb"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// ErrCloudBuild means a build configuration is not a valid Cloud Build Build message.
var ErrCloudBuild = errors.New("deploycheck: cloud build")

// ParseCloudBuild decodes a cloudbuild.yaml into the Cloud Build API's own Build message. Unknown
// fields are errors, so a misspelt key fails here rather than in the first real build.
func ParseCloudBuild(src []byte) (*cloudbuildpb.Build, error) {
	js, err := yaml.YAMLToJSON(src)
	if err != nil {
		return nil, fmt.Errorf("%w: yaml: %w", ErrCloudBuild, err)
	}
	var b cloudbuildpb.Build
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCloudBuild, err)
	}
	return &b, nil
}

// Built-in substitutions Cloud Build provides for triggered builds.
var builtinSubstitutions = map[string]bool{
	"PROJECT_ID": true, "PROJECT_NUMBER": true, "BUILD_ID": true, "LOCATION": true,
	"TRIGGER_NAME": true, "TRIGGER_BUILD_CONFIG_PATH": true, "SERVICE_ACCOUNT_EMAIL": true, "SERVICE_ACCOUNT": true,
	"COMMIT_SHA": true, "SHORT_SHA": true, "REVISION_ID": true, "REPO_NAME": true, "REPO_FULL_NAME": true,
	"BRANCH_NAME": true, "TAG_NAME": true, "REF_NAME": true,
	"_HEAD_BRANCH": true, "_BASE_BRANCH": true, "_HEAD_REPO_URL": true, "_PR_NUMBER": true,
}

// substitution matches $NAME and ${NAME}; $$ is a literal dollar and is removed before matching.
var substitution = regexp.MustCompile(`\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))`)

// CheckSubstitutions reports what Cloud Build would reject or silently ignore: a $NAME in a
// step that is neither built in nor declared under substitutions (the build fails), a declared
// user substitution nobody uses, and a user substitution not starting with an underscore.
func CheckSubstitutions(b *cloudbuildpb.Build) []error {
	var errs []error
	used := map[string]bool{}
	scan := func(where, s string) {
		s = strings.ReplaceAll(s, "$$", "")
		for _, m := range substitution.FindAllStringSubmatch(s, -1) {
			name := m[1] + m[2]
			used[name] = true
			if _, declared := b.GetSubstitutions()[name]; !declared && !builtinSubstitutions[name] {
				errs = append(errs, fmt.Errorf("%s: $%s is neither built in nor declared under substitutions", where, name))
			}
		}
	}
	for i, st := range b.GetSteps() {
		where := fmt.Sprintf("step %d (%s)", i, st.GetId())
		scan(where, st.GetName())
		scan(where, st.GetEntrypoint())
		scan(where, st.GetDir())
		for _, a := range st.GetArgs() {
			scan(where, a)
		}
		for _, e := range st.GetEnv() {
			scan(where, e)
		}
	}
	for _, img := range b.GetImages() {
		scan("images", img)
	}
	names := make([]string, 0, len(b.GetSubstitutions()))
	for name := range b.GetSubstitutions() {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !strings.HasPrefix(name, "_") {
			errs = append(errs, fmt.Errorf("substitution %s: user substitutions must start with _", name))
		}
		if !used[name] {
			errs = append(errs, fmt.Errorf("substitution %s is declared but never used", name))
		}
	}
	return errs
}

// StepArgs returns the steps' arguments joined by spaces, one string per step, for checks on
// what the pipeline runs.
func StepArgs(b *cloudbuildpb.Build) []string {
	out := make([]string, len(b.GetSteps()))
	for i, st := range b.GetSteps() {
		out[i] = strings.Join(append([]string{st.GetName(), st.GetEntrypoint()}, st.GetArgs()...), " ")
	}
	return out
}
