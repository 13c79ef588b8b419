package claim_test

import (
	"os"
	"testing"

	"github.com/genbox-dev/genbox/internal/emulator"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m, "ExampleDoc")) }
