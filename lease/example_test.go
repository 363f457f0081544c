package lease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func Example() {
	dir, err := os.MkdirTemp("", "lease-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		panic(err)
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	kv, err := lease.EnsureBucket(ctx, js, lease.BucketConfig{Name: "LEASES", TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	l, err := lease.Campaign(ctx, kv, "p.0", lease.Config{Holder: "worker-1"})
	if err != nil {
		panic(err)
	}
	// The fence is the revision of the Create. A bucket made by
	// EnsureBucket starts its revisions at its creation time in
	// microseconds, so the number differs from run to run.
	fmt.Println("holder:", l.Holder())

	// Someone else tries while it is held.
	_, err = lease.Acquire(ctx, kv, "p.0", lease.Config{Holder: "worker-2"})
	var held *lease.HeldError
	if errors.As(err, &held) {
		fmt.Println("held by", held.Holder, "at the fence's revision:", held.Revision == l.Fence())
	}

	// Check before acting; pass the fence with every protected write.
	if l.Trusted() {
		fmt.Println("acting with the fence")
	}
	if err := l.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println(l.Err())
	// Output:
	// holder: worker-1
	// held by worker-1 at the fence's revision: true
	// acting with the fence
	// lease: released: key "p.0"
}
