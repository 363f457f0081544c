//go:build unix

package embedded

import (
	"os"
	"syscall"
)

// errLocked is tryLock's error when another open file holds the lock.
var errLocked = syscall.EWOULDBLOCK

// tryLock takes an exclusive flock on f without waiting. flock locks
// belong to the open file, so a second open of the same file in this
// process is refused as well as one in another process.
func tryLock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}
