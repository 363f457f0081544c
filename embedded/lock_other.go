//go:build !unix

package embedded

import (
	"errors"
	"os"
)

var errLocked = errors.New("embedded: locked")

// tryLock does nothing where flock is missing: there the store is not
// guarded against a second server.
func tryLock(*os.File) error { return nil }
