package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// lockName is the file in StoreDir whose lock marks the store as taken.
// nats-server itself (v2.15) takes no lock on its store directory: two
// servers on one directory both start and then overwrite each other's
// files.
const lockName = "keylane.lock"

// A storeLock is the exclusive lock on one store directory, held from
// before the server opens the store until after it has shut down. The
// kernel drops the lock when the process dies, so a crashed worker leaves
// no stale lock behind.
type storeLock struct {
	f        *os.File
	fi       os.FileInfo    // identifies the lock file, whatever path named it
	srv      *server.Server // set once the server runs
	released chan struct{}  // closed after the lock is dropped
}

// held lists the locks this process holds, so that a Start right after a
// server's WaitForShutdown waits the few moments until that server's lock
// is dropped instead of failing.
var held struct {
	sync.Mutex
	locks []*storeLock
}

// lockStore takes the lock on dir, creating dir if needed. If a server of
// this process holds it and is shutting down, lockStore waits up to wait
// for it to let go.
func lockStore(dir string, wait time.Duration) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("embedded: %w", err)
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		// Try the lock and look for its holder under held's mutex, which
		// release holds while it drops a lock: a lock released between the
		// two would otherwise look held by nobody we could wait for.
		held.Lock()
		err := tryLock(f)
		var released <-chan struct{}
		if errors.Is(err, errLocked) {
			released = stoppingLocked(fi)
		}
		held.Unlock()
		if err == nil {
			break
		}
		if !errors.Is(err, errLocked) {
			f.Close()
			return nil, fmt.Errorf("embedded: locking %s: %w", f.Name(), err)
		}
		if released == nil {
			return nil, inUse(dir, f)
		}
		select {
		case <-released:
		case <-deadline.C:
			return nil, inUse(dir, f)
		}
	}
	// The holder's pid, for the error of whoever is refused next.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	l := &storeLock{f: f, fi: fi, released: make(chan struct{})}
	held.Lock()
	held.locks = append(held.locks, l)
	held.Unlock()
	return l, nil
}

// inUse closes f, the lock file another server holds, and returns the error
// for that, naming the holder's pid when the lock file says it.
func inUse(dir string, f *os.File) error {
	defer f.Close()
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid := strings.TrimSpace(string(b[:n])); pid != "" {
		return fmt.Errorf("%w: %s (held by pid %s)", ErrStoreInUse, dir, pid)
	}
	return fmt.Errorf("%w: %s", ErrStoreInUse, dir)
}

// stoppingLocked returns the channel closed when a server of this process
// that is shutting down releases the lock file fi, or nil if no such server
// holds it. The caller holds held's mutex.
func stoppingLocked(fi os.FileInfo) <-chan struct{} {
	for _, l := range held.locks {
		if os.SameFile(l.fi, fi) && l.srv != nil && !l.srv.Running() {
			return l.released
		}
	}
	return nil
}

// keepUntilShutdown hands the lock to s: it is released once s has shut
// down. The goroutine waiting for that belongs to s and ends with it.
func (l *storeLock) keepUntilShutdown(s *server.Server) {
	held.Lock()
	l.srv = s
	held.Unlock()
	go func() {
		s.WaitForShutdown()
		l.release()
	}()
}

// release drops the lock; the lock file stays for the next server.
func (l *storeLock) release() {
	held.Lock()
	defer held.Unlock()
	for i, h := range held.locks {
		if h == l {
			held.locks = append(held.locks[:i], held.locks[i+1:]...)
			break
		}
	}
	l.f.Close()
	close(l.released)
}
