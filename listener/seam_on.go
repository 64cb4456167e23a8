//go:build fulcrumseam

package listener

import "sync/atomic"

// seamHook, when set (by a test: setSeam), runs at every seamAt.
var seamHook atomic.Pointer[func(seamPoint, *session) error]

// seamAt runs the test's hook, if any, at point p of session ss.
func seamAt(p seamPoint, ss *session) error {
	if f := seamHook.Load(); f != nil {
		return (*f)(p, ss)
	}
	return nil
}
