//go:build !fulcrumseam

package listener

// seamAt is the test-only seam (seam.go): nothing in the release build.
func seamAt(seamPoint, *session) error { return nil }
