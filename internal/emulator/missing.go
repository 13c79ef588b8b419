package emulator

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// MissingError says what Start lacks to run the emulators and how to install it on this machine.
// errors.Is(err, ErrMissing) holds for it.
type MissingError struct {
	Java, Firestore, PubSub bool   // what is missing
	SDKRoot                 string // where the emulators were looked for
	SDKFound                bool   // whether a Google Cloud CLI is there
	// Install is how to get what is missing here: usually one command, else the steps in order.
	Install []string
}

func (e *MissingError) Is(target error) bool { return target == ErrMissing }

func (e *MissingError) Error() string {
	var what []string
	if e.Firestore {
		what = append(what, "the Firestore emulator")
	}
	if e.PubSub {
		what = append(what, "the Pub/Sub emulator")
	}
	var notes []string
	switch {
	case !e.Firestore && !e.PubSub:
	case e.SDKFound:
		notes = append(notes, "the emulators were looked for in the Google Cloud CLI at "+e.SDKRoot)
	default:
		notes = append(notes, "there is no Google Cloud CLI at "+e.SDKRoot+"; CLOUDSDK_ROOT names another")
	}
	if e.Java {
		what = append(what, "a Java 17 runtime")
		notes = append(notes, "java was looked for on PATH")
	}
	verb := "it"
	if len(what) > 1 {
		verb = "them"
	}
	return ErrMissing.Error() + ": " + andList(what) + " (" + strings.Join(notes, "; ") + "). Install " + verb +
		" with:\n  " + strings.Join(e.Install, "\n  ")
}

func andList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// Package names of what the emulators need, per way of installing.
var (
	aptPackages        = map[string]string{"firestore": "google-cloud-cli-firestore-emulator", "pubsub": "google-cloud-cli-pubsub-emulator", "java": "openjdk-17-jre-headless"}
	gcloudComponents   = map[string]string{"firestore": "cloud-firestore-emulator", "pubsub": "pubsub-emulator"}
	googleAptRepo      = "packages.cloud.google.com/apt"
	installGoogleCloud = "install the Google Cloud CLI: https://cloud.google.com/sdk/docs/install"
	addGoogleAptRepo   = "add Google Cloud's apt repository: docs/development.md, Prerequisites (https://cloud.google.com/sdk/docs/install#deb)"
	installJava        = "install a Java 17 runtime from your system's packages (OpenJDK 17)"
)

// installSteps says how to install what e lacks on this machine, as it finds it: a Google Cloud
// CLI with its own component manager takes `gcloud components install`; one from a Debian or
// Ubuntu package (its component manager is off), or a Debian or Ubuntu machine with Google's apt
// repository and no CLI yet, takes one apt-get command for everything, Java included. sys is
// where /etc is read from ("/" but in tests).
func (e *MissingError) installSteps(sys string) []string {
	var emulators []string
	if e.Firestore {
		emulators = append(emulators, "firestore")
	}
	if e.PubSub {
		emulators = append(emulators, "pubsub")
	}
	debian, aptRepo := debianLike(sys), hasGoogleAptRepo(sys)
	managed, found := componentManager(e.SDKRoot)
	e.SDKFound = found
	var steps []string
	switch {
	case len(emulators) == 0:
	case found && managed:
		steps = append(steps, "gcloud components install "+strings.Join(names(gcloudComponents, emulators), " "))
	case debian && (found || aptRepo):
		// One apt-get for everything; Java goes with it.
	case debian:
		steps = append(steps, addGoogleAptRepo)
	case found:
		steps = append(steps, "install "+strings.Join(names(aptPackages, emulators), " and ")+" with the package manager the Google Cloud CLI came from")
	default:
		steps = append(steps, installGoogleCloud, "gcloud components install "+strings.Join(names(gcloudComponents, emulators), " "))
	}
	var apt []string
	if debian && (!found || !managed) { // apt unless gcloud manages the components
		apt = names(aptPackages, emulators)
	}
	if e.Java {
		if debian {
			apt = append(apt, aptPackages["java"])
		} else {
			steps = append(steps, installJava)
		}
	}
	if len(apt) > 0 {
		steps = append(steps, sudo()+"apt-get install -y "+strings.Join(apt, " "))
	}
	return steps
}

func names(of map[string]string, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = of[k]
	}
	return out
}

func sudo() string {
	if os.Geteuid() == 0 {
		return ""
	}
	return "sudo "
}

// componentManager reports whether the Google Cloud CLI at root manages its own components
// (installed from Google's archive) rather than a system package manager, and whether there is a
// CLI at root at all.
func componentManager(root string) (managed, found bool) {
	data, err := os.ReadFile(filepath.Join(root, "lib", "googlecloudsdk", "core", "config.json"))
	if err != nil {
		return false, false
	}
	var cfg struct {
		DisableUpdater bool `json:"disable_updater"`
	}
	if json.Unmarshal(data, &cfg) != nil {
		return false, true
	}
	return !cfg.DisableUpdater, true
}

// debianLike reports whether the machine is Debian, Ubuntu or derived from them (os-release).
func debianLike(sys string) bool {
	data, err := os.ReadFile(filepath.Join(sys, "etc", "os-release"))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(data)) {
		key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || (key != "ID" && key != "ID_LIKE") {
			continue
		}
		if slices.ContainsFunc(strings.Fields(strings.Trim(value, `"'`)), func(id string) bool { return id == "debian" || id == "ubuntu" }) {
			return true
		}
	}
	return false
}

// hasGoogleAptRepo reports whether apt's sources name Google Cloud's repository.
func hasGoogleAptRepo(sys string) bool {
	files := []string{filepath.Join(sys, "etc", "apt", "sources.list")}
	for _, pattern := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(sys, "etc", "apt", "sources.list.d", pattern))
		files = append(files, m...)
	}
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), googleAptRepo) {
			return true
		}
	}
	return false
}
