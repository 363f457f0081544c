package namespace

import (
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestSpreadLeadersOnCluster: on three nodes with R3, three shards whose
// leaders were put together on one node are spread over all three by
// SpreadLeaders, through preferred-server step-downs, and ShardLeaders
// reports where they landed.
func TestSpreadLeadersOnCluster(t *testing.T) {
	c := natscluster.Start(t, natscluster.Options{})
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(ctx(t), js, Config{Namespace: "spread", Partitions: 6, StreamShards: 3, Replicas: 3}, nil); err != nil {
		t.Fatal(err)
	}
	var ls []ShardLeader
	testwait.Eventually(t, 30*time.Second, "every shard led, with two current followers", func() bool {
		ls, err = ShardLeaders(ctx(t), js, "spread")
		if err != nil {
			return false
		}
		for _, l := range ls {
			if l.Leader == "" || len(l.Followers) != 2 {
				return false
			}
		}
		return true
	})
	// Put every shard's leader on shard 0's node.
	for _, l := range ls[1:] {
		if l.Leader != ls[0].Leader {
			if err := stepDownStream(ctx(t), js, l.Stream, l.Leader, ls[0].Leader); err != nil {
				t.Fatal(err)
			}
		}
	}
	testwait.Eventually(t, 30*time.Second, "all shards led by "+ls[0].Leader+", with current followers", func() bool {
		got, err := ShardLeaders(ctx(t), js, "spread")
		if err != nil {
			return false
		}
		for _, l := range got {
			if l.Leader != ls[0].Leader || len(l.Followers) != 2 {
				return false
			}
		}
		return true
	})
	after, err := SpreadLeaders(ctx(t), js, "spread")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range after {
		seen[l.Leader] = true
		t.Logf("shard %d %s: leader %s", l.Shard, l.Stream, l.Leader)
	}
	if len(seen) != 3 || seen[""] {
		t.Fatalf("leaders after spreading: %+v; want three different servers", after)
	}
}
