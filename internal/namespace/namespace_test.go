package namespace

import (
	"errors"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeleteNamespaceLeavesBucketsOfNoNamespace: a user's own KV bucket
// that merely bears a namespace's bucket name (ORDERS_STATE), with no
// keylane namespace "orders" on the server, is not the namespace's:
// NamespaceObjects lists nothing and DeleteNamespace refuses, deleting
// nothing. Before, buckets were matched by name alone and "keylane
// namespace delete orders --yes" deleted the user's bucket.
func TestDeleteNamespaceLeavesBucketsOfNoNamespace(t *testing.T) {
	js := startJS(t)
	if _, err := Setup(ctx(t), js, Config{Partitions: 1, LeaseTTL: time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: "ORDERS_STATE"}); err != nil {
		t.Fatal(err)
	}
	if objs, err := NamespaceObjects(ctx(t), js, "orders"); err != nil || len(objs) != 0 {
		t.Fatalf("objects of orders, which has no jobs stream: %v, %v; want none", objs, err)
	}
	if deleted, err := DeleteNamespace(ctx(t), js, "orders", true); !errors.Is(err, core.ErrNoTopology) || len(deleted) != 0 {
		t.Fatalf("delete of orders: deleted %v, %v; want ErrNoTopology and nothing deleted", deleted, err)
	}
	if _, err := js.KeyValue(ctx(t), "ORDERS_STATE"); err != nil {
		t.Fatalf("the user's bucket ORDERS_STATE: %v", err)
	}
}
