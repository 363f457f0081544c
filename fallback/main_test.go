package fallback_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/keylane/keylane/fallback"
	"github.com/keylane/keylane/internal/redistest"
)

// redisAddr is the shared redis-server started by TestMain; examples use it.
var redisAddr string

func TestMain(m *testing.M) {
	srv, err := redistest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fallback tests need redis-server:", err)
		os.Exit(1)
	}
	redisAddr = srv.Addr
	// Killed servers make go-redis log every failed dial; keep test output
	// readable.
	redis.SetLogger(quietLogger{})
	code := m.Run()
	srv.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newLocker(t testing.TB, cfg *fallback.Config) (*fallback.Locker, *redis.Client) {
	t.Helper()
	c := newClient(t, redisAddr)
	l, err := fallback.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, c
}

var keySeq atomic.Int64

// uniqueKey gives each test its own lock name.
func uniqueKey(t testing.TB) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), keySeq.Add(1))
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
