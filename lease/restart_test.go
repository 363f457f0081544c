package lease_test

import (
	"net"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A holder keeps its lease through a server restart shorter than its trust
// window, and the fences of later tenures still grow.
func TestLeaseSurvivesServerRestart(t *testing.T) {
	const ttl = 2 * time.Second
	dir := t.TempDir()
	s := natstest.Start(t, natstest.WithStoreDir(dir))
	port := s.Addr().(*net.TCPAddr).Port
	// Reconnect soon after the restart, well within the trust window.
	nc := natstest.Connect(t, s, nats.ReconnectWait(20*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := lease.EnsureBucket(t.Context(), js, lease.BucketConfig{Name: bucketName, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lease.Acquire(t.Context(), kv, "p.0", config(t, "holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Orphan()

	s.Shutdown()
	s.WaitForShutdown()
	down := time.Now()
	before := l.Revision()
	natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	t.Logf("server down for %s", time.Since(down))

	testwait.Eventually(t, ttl, "a renew lands on the restarted server", func() bool {
		return l.Revision() > before
	})
	if !l.Trusted() {
		t.Fatalf("lease not trusted after the restart: %v", l.Err())
	}
	last := l.Revision()
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	next, err := lease.Acquire(t.Context(), kv, "p.0", config(t, "next"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Release(t.Context()) }()
	if next.Fence() <= last {
		t.Fatalf("fence %d after the restart not above the last revision %d", next.Fence(), last)
	}
	t.Logf("renewed across the restart (revision %d -> %d); next fence %d", before, last, next.Fence())
}
