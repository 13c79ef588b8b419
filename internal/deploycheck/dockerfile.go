package deploycheck

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// DockerfileWant is what the services' Dockerfile must build for one service.
type DockerfileWant struct {
	// Service is the SERVICE build argument: the directory under services/ the binary is built
	// from.
	Service string
	// MinGoPatch is the lowest Go 1.26 patch release the builder may use.
	MinGoPatch int
}

var (
	goBuilder  = regexp.MustCompile(`^FROM\s+golang:1\.26\.(\d+)-(bookworm|trixie)(@sha256:[0-9a-f]{64})?\s+AS\s+(\S+)$`)
	distroless = regexp.MustCompile(`^FROM\s+gcr\.io/distroless/static-debian\d+:nonroot(@sha256:[0-9a-f]{64})?$`)
	goBuild    = regexp.MustCompile(`^RUN\s+.*\bgo build\b`)
	// serviceArg is the shell's reference to the SERVICE build argument: $SERVICE, ${SERVICE}
	// or ${SERVICE:?message}.
	serviceArg = regexp.MustCompile(`\$\{SERVICE(:\?[^}]*)?\}|\$SERVICE\b`)
)

// CheckDockerfile checks the services' Dockerfile as built with --build-arg SERVICE=<service>: a
// pinned, patched Go builder; a static build (CGO_ENABLED=0) with -trimpath and without the crash
// points of ./services/$SERVICE, the argument declared in the builder stage without a default; a
// distroless static final image run as nonroot whose exec-form ENTRYPOINT is the binary built.
func CheckDockerfile(src []byte, want DockerfileWant) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("Dockerfile (SERVICE=%s): "+format, append([]any{want.Service}, args...)...))
	}
	var lines []string
	var froms []int // index in lines of each FROM
	for _, l := range strings.Split(string(src), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(strings.ToUpper(l), "FROM ") {
			froms = append(froms, len(lines))
		}
		lines = append(lines, l)
	}
	if len(froms) != 2 {
		fail("want two stages (Go builder, distroless runtime), got %d FROM lines", len(froms))
		return errs
	}
	builder, runtime := lines[froms[0]:froms[1]], lines[froms[1]:]
	stage := "0"
	if m := goBuilder.FindStringSubmatch(builder[0]); m == nil {
		fail("builder %q is not golang:1.26.N-bookworm pinned by exact tag", builder[0])
	} else {
		stage = m[4]
		if patch, _ := strconv.Atoi(m[1]); patch < want.MinGoPatch {
			fail("builder Go 1.26.%d is older than 1.26.%d", patch, want.MinGoPatch)
		}
	}
	if !distroless.MatchString(runtime[0]) {
		fail("runtime %q is not gcr.io/distroless/static-*:nonroot", runtime[0])
	}
	all := strings.Join(lines, "\n")
	if strings.Contains(all, "genbox_crashpoints") {
		fail("builds with the genbox_crashpoints tag, whose worker kills itself at the crash points")
	}

	build, out := "", ""
	at := slices.IndexFunc(builder, goBuild.MatchString)
	if at < 0 {
		fail("no RUN go build in the builder stage")
	} else {
		declared := false
		for _, l := range builder[:at] {
			f := strings.Fields(l)
			if len(f) != 2 || f[0] != "ARG" {
				continue
			}
			if name, def, ok := strings.Cut(f[1], "="); name == "SERVICE" {
				declared = true
				if ok {
					fail("ARG SERVICE defaults to %q: a build without --build-arg SERVICE would build that service", def)
				}
			}
		}
		if !declared {
			fail("the builder stage declares no ARG SERVICE before go build")
		}
		build = serviceArg.ReplaceAllString(builder[at], want.Service)
		if build == builder[at] {
			fail("go build does not name its package by $SERVICE")
		}
		if !strings.Contains(build, "-trimpath") {
			fail("go build without -trimpath")
		}
		f := strings.Fields(build)
		if strings.Trim(f[len(f)-1], `"'`) != "./services/"+want.Service {
			fail("go build does not build ./services/%s", want.Service)
		}
		if i := slices.Index(f, "-o"); i >= 0 && i+1 < len(f) {
			out = f[i+1]
		} else {
			fail("go build names no -o output for the runtime stage to copy")
		}
	}
	if !regexp.MustCompile(`(?m)^(ENV|ARG)\s+.*\bCGO_ENABLED=0\b`).MatchString(all) && !strings.Contains(build, "CGO_ENABLED=0") {
		fail("CGO_ENABLED=0 is not set: the binary must be static for distroless/static")
	}

	user, binary := "", ""
	for _, l := range runtime {
		if u, ok := strings.CutPrefix(l, "USER "); ok {
			user = strings.TrimSpace(u)
		}
		if from, src, dst, ok := copyFrom(l); ok && (from == stage || from == "0") && src == out {
			binary = dst
			if strings.HasSuffix(dst, "/") {
				binary = dst + path.Base(out)
			}
		}
	}
	if user != "nonroot" && user != "nonroot:nonroot" && user != "65532" && user != "65532:65532" {
		fail("final stage runs as %q, want USER nonroot", user)
	}
	last := runtime[len(runtime)-1]
	entry, ok := strings.CutPrefix(last, "ENTRYPOINT ")
	var argv []string
	switch {
	case !ok:
		fail("last instruction %q is not the ENTRYPOINT", last)
	case json.Unmarshal([]byte(entry), &argv) != nil || len(argv) == 0:
		fail("ENTRYPOINT %s is not the exec form: distroless/static has no shell to run it", entry)
	case out == "": // no build output to look for, already reported
	case binary == "":
		fail("the runtime stage copies no %s from the builder", out)
	case argv[0] != binary:
		fail("ENTRYPOINT runs %s, not the binary built (%s, copied to %s)", argv[0], out, binary)
	}
	return errs
}

// copyFrom returns the stage, source and destination of a COPY --from=<stage> <src> <dst>.
func copyFrom(line string) (stage, src, dst string, ok bool) {
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "COPY" {
		return "", "", "", false
	}
	for _, flag := range f[1 : len(f)-2] {
		if !strings.HasPrefix(flag, "--") {
			return "", "", "", false // more than one source
		}
		if v, found := strings.CutPrefix(flag, "--from="); found {
			stage = v
		}
	}
	return stage, f[len(f)-2], f[len(f)-1], stage != ""
}
