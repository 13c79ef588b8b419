//go:build !genbox_crashpoints

package crashpoint

const tagged = false
