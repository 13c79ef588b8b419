package deploycheck_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// The toolchain go.mod pins is the patched Go the images are built with (and the check build
// runs on), so `go` on a developer's machine fetches that Go instead of building with an older
// one; GOTOOLCHAIN=local still builds with the local Go, as go.mod's go line is older.
func TestToolchainIsTheImagesGo(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := modfile.Parse("go.mod", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	docker, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^FROM\s+golang:(1\.26\.\d+)-`).FindSubmatch(docker)
	if m == nil {
		t.Fatal("the Dockerfile has no golang:1.26.N builder")
	}
	want := "go" + string(m[1])
	if mod.Toolchain == nil || mod.Toolchain.Name != want {
		t.Errorf("go.mod toolchain %v, want %s (the Dockerfile's builder)", mod.Toolchain, want)
	}
	if mod.Go == nil || semver.Compare("v"+mod.Go.Version, "v"+string(m[1])) > 0 {
		t.Errorf("go.mod's go line %v is newer than the toolchain %s", mod.Go, want)
	}
}

// digest pins an image reference to one content: name[:tag]@sha256:<64 hex>.
var digest = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)

// unpinned are the third-party images not yet pinned by digest, with why: no registry was
// reachable from where this was written and no authoritative digest could be found.
// scripts/pin-images.sh pins every image with a registry at hand; then remove its entry here.
var unpinned = map[string]string{
	"golang:1.26.11-bookworm":                              "no authoritative digest found offline",
	"gcr.io/distroless/static-debian12:nonroot":            "no authoritative digest found offline",
	"gcr.io/cloud-builders/docker":                         "no authoritative digest found offline",
	"gcr.io/google.com/cloudsdktool/google-cloud-cli:slim": "no authoritative digest found offline",
	"hashicorp/terraform:1.11.4":                           "no authoritative digest found offline",
}

// imageRefs returns every image the Dockerfile builds from and the Cloud Build configurations
// run, each with where it is used.
func imageRefs(t *testing.T) map[string]string {
	t.Helper()
	refs := map[string]string{}
	docker, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllSubmatch(docker, -1) {
		refs[string(m[1])] = "Dockerfile"
	}
	for _, name := range []string{"cloudbuild.yaml", "cloudbuild.check.yaml"} {
		_, b := readCloudBuild(t, name)
		for _, st := range b.GetSteps() {
			refs[st.GetName()] = name + " step " + st.GetId()
		}
	}
	return refs
}

// Every third-party image is pinned by digest (a tag can be moved to other content), unless
// listed in unpinned; an entry there that is pinned by now, or no longer used, must go.
func TestThirdPartyImagesPinnedByDigest(t *testing.T) {
	t.Parallel()
	refs := imageRefs(t)
	var errs []error
	for ref, where := range refs {
		if digest.MatchString(ref) {
			if _, listed := unpinned[digest.ReplaceAllString(ref, "")]; listed {
				errs = append(errs, fmt.Errorf("%s (%s) is pinned now: remove it from unpinned", ref, where))
			}
			continue
		}
		if _, listed := unpinned[ref]; !listed {
			errs = append(errs, fmt.Errorf("%s (%s) is not pinned by digest (name:tag@sha256:…): run scripts/pin-images.sh", ref, where))
		}
	}
	for ref := range unpinned {
		if _, used := refs[ref]; !used {
			errs = append(errs, fmt.Errorf("unpinned lists %s, which nothing uses unpinned", ref))
		}
	}
	noErrors(t, errs)
}
