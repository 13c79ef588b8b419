package deploycheck

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DockerfileWant is what every service image must be.
type DockerfileWant struct {
	// Service is the directory under services/ the binary is built from.
	Service string
	// MinGoPatch is the lowest Go 1.26 patch release the builder may use.
	MinGoPatch int
}

var (
	goBuilder  = regexp.MustCompile(`^FROM\s+golang:1\.26\.(\d+)-(bookworm|trixie)(@sha256:[0-9a-f]{64})?\s+AS\s+\S+$`)
	distroless = regexp.MustCompile(`^FROM\s+gcr\.io/distroless/static-debian\d+:nonroot(@sha256:[0-9a-f]{64})?$`)
)

// CheckDockerfile checks a service Dockerfile: a pinned, patched Go builder; a static build
// (CGO_ENABLED=0) with -trimpath of ./services/<service>; a distroless static final image run as
// nonroot.
func CheckDockerfile(src []byte, want DockerfileWant) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("services/%s/Dockerfile: "+format, append([]any{want.Service}, args...)...))
	}
	var froms, lines []string
	for _, l := range strings.Split(string(src), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		lines = append(lines, l)
		if strings.HasPrefix(strings.ToUpper(l), "FROM ") {
			froms = append(froms, l)
		}
	}
	if len(froms) != 2 {
		fail("want two stages (Go builder, distroless runtime), got %d FROM lines", len(froms))
		return errs
	}
	if m := goBuilder.FindStringSubmatch(froms[0]); m == nil {
		fail("builder %q is not golang:1.26.N-bookworm pinned by exact tag", froms[0])
	} else if patch, _ := strconv.Atoi(m[1]); patch < want.MinGoPatch {
		fail("builder Go 1.26.%d is older than 1.26.%d", patch, want.MinGoPatch)
	}
	if !distroless.MatchString(froms[1]) {
		fail("runtime %q is not gcr.io/distroless/static-*:nonroot", froms[1])
	}
	all := strings.Join(lines, "\n")
	build := regexp.MustCompile(`(?m)^RUN\s+.*\bgo build\b.*$`).FindString(all)
	switch {
	case build == "":
		fail("no RUN go build")
	default:
		if !strings.Contains(build, "-trimpath") {
			fail("go build without -trimpath")
		}
		if !strings.HasSuffix(build, "./services/"+want.Service) {
			fail("go build does not build ./services/%s", want.Service)
		}
	}
	if !regexp.MustCompile(`(?m)^(ENV|ARG)\s+.*\bCGO_ENABLED=0\b`).MatchString(all) && !strings.Contains(build, "CGO_ENABLED=0") {
		fail("CGO_ENABLED=0 is not set: the binary must be static for distroless/static")
	}
	last := lines[len(lines)-1]
	user := ""
	for _, l := range lines[indexOf(lines, froms[1]):] {
		if strings.HasPrefix(l, "USER ") {
			user = strings.TrimSpace(strings.TrimPrefix(l, "USER "))
		}
	}
	if user != "nonroot" && user != "nonroot:nonroot" && user != "65532" && user != "65532:65532" {
		fail("final stage runs as %q, want USER nonroot", user)
	}
	if !strings.HasPrefix(last, "ENTRYPOINT ") {
		fail("last instruction %q is not the ENTRYPOINT", last)
	}
	return errs
}

func indexOf(lines []string, s string) int {
	for i, l := range lines {
		if l == s {
			return i
		}
	}
	return 0
}
