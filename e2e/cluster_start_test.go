package e2e

import (
	"testing"
	"time"
)

// TestClusterConcurrentStart starts three workers at the same moment on a
// fresh three-node cluster with --replicas 3, as a deployment does, and
// checks that they all come up and balance the partitions, on R3 objects.
//
// It failed before setup retried (see the cluster issue): the workers
// raced to create the same R3 streams, and a create or update of a stream
// whose creation was still in flight in the meta layer got no reply, so
// setup ended in "context deadline exceeded" and the worker exited.
func TestClusterConcurrentStart(t *testing.T) {
	skipUnlessCluster(t)
	start := time.Now()
	nc, c := startOnCluster(t, "e2e-cluster-start", false)
	t.Logf("%d workers balanced %d partitions in %s, cluster start included", clusterWorkers, partitions, time.Since(start).Round(time.Millisecond))
	checkR3(t, nc, c, 30*time.Second)
}
