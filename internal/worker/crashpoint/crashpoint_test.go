package crashpoint

import "testing"

// Without the genbox_crashpoints tag nothing can arm a crash point, whatever the environment.
func TestUnarmedInProduction(t *testing.T) {
	t.Setenv("GENBOX_CRASHPOINT", string(AfterClaim))
	if armed != nil && !tagged {
		t.Fatal("crash points armed in a build without the genbox_crashpoints tag")
	}
	for _, p := range append(Points, BatchPoints...) {
		if !tagged {
			Hit(p) // must return
		}
	}
}
