// Package fallback_test compares package fallback's lock with the Redis
// lock libraries users replace with it (redsync, redislock) on one hot key.
// It lives in the bench module so the library's go.mod does not list them:
//
//	cd bench && go test -run '^$' -bench FlashSale -benchtime 2000x ./fallback/
package fallback_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/keylane/keylane/internal/redistest"
)

// keySeq makes every run's keys its own.
var keySeq atomic.Int64

// redisAddr is the redis-server TestMain starts.
var redisAddr string

func TestMain(m *testing.M) {
	srv, err := redistest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "the fallback benchmark needs redis-server:", err)
		os.Exit(1)
	}
	redisAddr = srv.Addr
	code := m.Run()
	srv.Stop()
	os.Exit(code)
}
