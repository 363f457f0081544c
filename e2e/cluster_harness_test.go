package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// clusterWorkers is how many workers run against the cluster.
const clusterWorkers = 3

// skipUnlessCluster skips a cluster test in -short: each starts a
// three-node cluster of its own and runs for tens of seconds.
func skipUnlessCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("cluster: skipped in -short")
	}
}

// startOnCluster starts a three-node NATS cluster and clusterWorkers
// workers on it with --replicas 3 in namespace ns, opens a client, watches
// the leases and waits for balance. With staggered, the first worker
// creates the namespace alone and the others start once it is there.
func startOnCluster(t *testing.T, ns string, staggered bool) (*natscluster.Cluster, *cluster) {
	t.Helper()
	return startOnClusterWith(t, ns, staggered, nil)
}

// startOnClusterWith is startOnCluster with extra flags for worker i from
// extra (nil: none), called once the cluster runs and before worker i
// starts: "--nats" through a fault proxy, say (a later flag wins).
func startOnClusterWith(t *testing.T, ns string, staggered bool, extra func(nc *natscluster.Cluster, i int) []string) (*natscluster.Cluster, *cluster) {
	t.Helper()
	var nc *natscluster.Cluster
	var c *cluster
	// The first TempDir registers the removal of every temporary
	// directory of the test; keepLogs must run before it and after the
	// processes stopped.
	_ = t.TempDir()
	keepLogs(t, &nc, &c)
	nc = natscluster.Start(t, natscluster.Options{})
	urls := nc.URLs()
	c = clusterOn(t, urls, ns, "--nats", urls, "--replicas", "3")
	var ws []*workerProc
	for i := range clusterWorkers {
		var args []string
		if extra != nil {
			args = extra(nc, i)
		}
		ws = append(ws, c.startWorkerWith(fmt.Sprintf("%s-w%d", ns, i), args...))
		if staggered && i == 0 {
			c.waitNamespace(60*time.Second, ws...)
		}
	}
	c.waitNamespace(60*time.Second, ws...)
	c.client = c.openClient()
	t.Cleanup(c.client.Close)
	c.leases = watchLeases(t, c.js, c.names)
	c.waitBalanced(60 * time.Second)
	c.requireAlive()
	return nc, c
}

// waitNamespace waits until the namespace's state bucket, the last object
// a worker's setup makes, exists; it fails at once if one of ws exits.
func (c *cluster) waitNamespace(timeout time.Duration, ws ...*workerProc) {
	c.t.Helper()
	testwait.NoError(c.t, timeout, "namespace "+c.ns+" not set up", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.js.KeyValue(ctx, c.names.State())
		if err == nil {
			return nil
		}
		for _, w := range ws {
			if w.exited() {
				return testwait.Stop(fmt.Errorf("worker %s exited while setting up the namespace: %v\n%s", w.id, w.exitErr, tail(w.stderr, 20)))
			}
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, context.DeadlineExceeded) {
			return testwait.Stop(err)
		}
		return err
	})
}

// checkR3 checks that every stream, bucket and partition consumer of the
// namespace is configured with three replicas and has three peers (a
// consumer as its leader node reports it: natscluster.ConsumerPeers). A
// consumer is recreated on every change of owner, so one may be without a
// leader or peers for a moment: each gets until timeout to show three.
func checkR3(t *testing.T, nc *natscluster.Cluster, c *cluster, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	peers := func(cl *jetstream.ClusterInfo) int {
		switch {
		case cl == nil:
			return 0
		case cl.Leader == "":
			return len(cl.Replicas) // no leader: Replicas lists every peer
		default:
			return 1 + len(cl.Replicas)
		}
	}
	type object struct {
		what string
		info func() (int, *jetstream.ClusterInfo, error)
	}
	var objs []object
	for _, name := range []string{c.names.Jobs(), c.names.Dead()} {
		objs = append(objs, object{"stream " + name, func() (int, *jetstream.ClusterInfo, error) {
			s, err := c.js.Stream(ctx, name)
			if err != nil {
				return 0, nil, err
			}
			info := s.CachedInfo()
			return info.Config.Replicas, info.Cluster, nil
		}})
	}
	for _, name := range []string{c.names.Leases(), c.names.Members(), c.names.Results(), c.names.State()} {
		objs = append(objs, object{"bucket " + name, func() (int, *jetstream.ClusterInfo, error) {
			kv, err := c.js.KeyValue(ctx, name)
			if err != nil {
				return 0, nil, err
			}
			st, err := kv.Status(ctx)
			if err != nil {
				return 0, nil, err
			}
			info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
			return info.Config.Replicas, info.Cluster, nil
		}})
	}
	for p := range partitions {
		name := c.names.Consumer(p)
		objs = append(objs, object{"consumer " + name, func() (int, *jetstream.ClusterInfo, error) {
			replicas, leader, peers, err := nc.ConsumerPeers(ctx, c.names.Jobs(), name)
			if err != nil {
				return 0, nil, err
			}
			cl := &jetstream.ClusterInfo{Leader: leader}
			for range peers - 1 {
				cl.Replicas = append(cl.Replicas, &jetstream.PeerInfo{})
			}
			return replicas, cl, nil
		}})
	}
	for _, o := range objs {
		var seen error // the last answer that was not the deadline's
		var seenCl *jetstream.ClusterInfo
		for {
			replicas, cl, err := o.info()
			if err == nil && replicas == 3 && peers(cl) == 3 && cl.Leader != "" {
				break
			}
			if err == nil && replicas != 3 {
				t.Errorf("%s: configured with %d replicas, want 3", o.what, replicas)
				break
			}
			if ctx.Err() == nil {
				seen, seenCl = err, cl
			}
			if ctx.Err() != nil {
				t.Errorf("%s: not three peers with a leader within %s: last err %v, cluster info %+v", o.what, timeout, seen, seenCl)
				break
			}
			time.Sleep(50 * time.Millisecond) // polling with a deadline
		}
	}
}

// keepLogs copies every worker's and node's log to $KEYLANE_CLUSTER_LOGS/<test>
// when the test ends, if that is set: the harness quotes only their tails.
// Register it after the test's first TempDir and before the cluster and
// workers start, so it runs after they stopped and before their
// directories are removed.
func keepLogs(t *testing.T, nc **natscluster.Cluster, c **cluster) {
	dir := os.Getenv("KEYLANE_CLUSTER_LOGS")
	if dir == "" {
		return
	}
	t.Cleanup(func() {
		dst := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Logf("keep logs: %v", err)
			return
		}
		var files []string
		if *c != nil {
			(*c).mu.Lock()
			for _, w := range (*c).workers {
				files = append(files, w.stderr, w.trace)
			}
			(*c).mu.Unlock()
		}
		if *nc != nil {
			for _, n := range (*nc).Nodes() {
				files = append(files, n.Log())
			}
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			name := filepath.Base(f)
			if name == "nats.log" {
				name = filepath.Base(filepath.Dir(f)) + ".nats.log"
			}
			if err := os.WriteFile(filepath.Join(dst, name), b, 0o644); err != nil {
				t.Logf("keep logs: %v", err)
			}
		}
		t.Logf("logs kept in %s", dst)
	})
}

// consumerLeaders lists which node leads each partition's consumer.
func consumerLeaders(ctx context.Context, nc *natscluster.Cluster, c *cluster) string {
	var out []string
	for p := range partitions {
		n, err := nc.ConsumerLeader(ctx, c.names.Jobs(), c.names.Consumer(p))
		name := "?"
		if err == nil {
			name = n.Name()
		}
		out = append(out, c.names.Consumer(p)+"@"+name)
	}
	return strings.Join(out, " ")
}
