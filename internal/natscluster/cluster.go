package natscluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TB is the part of *testing.T and *testing.B the harness uses.
type TB interface {
	Helper()
	Cleanup(func())
	TempDir() string
	Failed() bool
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Options configure Start.
type Options struct {
	// Nodes is the number of servers. Defaults to 3; one is a plain
	// server without a cluster block.
	Nodes int
	// Binary is the nats-server executable. Defaults to one built from the
	// nats-server module version in go.mod (see Binary).
	Binary string
	// Name is the cluster's name; server names are Name-0, Name-1, ….
	// Defaults to "keylane".
	Name string
	// StartTimeout bounds the wait for the cluster to become healthy.
	// Defaults to 60s.
	StartTimeout time.Duration
	// ProxiedLinks lists pairs of node indexes whose route connections go
	// through fault proxies (internal/faultproxy), whichever side dials,
	// so a test can delay the replication between two nodes (Link) while
	// every other pair talks directly. With any link, every node
	// advertises a route address that refuses connections (deadRoute), so
	// that no route is made from gossip: each is one of the configured
	// routes, and Launch checks that none escapes its link (CheckRoutes).
	// Defaults to none.
	ProxiedLinks [][2]int
}

// System account credentials: the meta leader step-down is a system
// account request. Clients that give no credentials are the application
// user (no_auth_user), whose account has JetStream.
const (
	sysUser     = "sys"
	sysPassword = "sys"
)

// Cluster is a running set of nats-server processes routed into one
// cluster with JetStream. Its methods are safe for concurrent use, but
// only Start may call the test's Fatalf: the rest return errors.
type Cluster struct {
	name  string
	dir   string
	nodes []*Node
	links []*Link

	nc  *nats.Conn // application account, for the JetStream API
	js  jetstream.JetStream
	sys *nats.Conn // system account, for the meta step-down
}

// Start runs opts.Nodes nats-server processes on free loopback ports,
// each with its own store under t.TempDir(), routed to each other, and
// waits until the cluster is healthy (WaitHealthy). Every process is
// killed when the test ends, also when it fails; a failed test gets the
// tail of every node's log.
func Start(t TB, opts Options) *Cluster {
	t.Helper()
	// The directory first: its removal is a clean-up that must run after
	// the processes are gone.
	dir := t.TempDir()
	c, err := Launch(context.Background(), dir, opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("---- %s (%s), last lines of its log:\n%s", n.name, n.URL(), n.tail(30))
			}
		}
		c.Close()
	})
	return c
}

// Launch is Start outside a test (a benchmark, a demo): the stores go
// under dir, and the caller must Close the cluster, which kills every
// process (on Linux they die with this process too). ctx bounds the
// build of the binary and the start; on an error nothing is left
// running, and the error carries the tail of every node's log.
func Launch(ctx context.Context, dir string, opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Name == "" {
		opts.Name = "keylane"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout+5*time.Minute)
	defer cancel()
	if opts.Binary == "" {
		bin, err := cachedBinary(ctx)
		if err != nil {
			return nil, err
		}
		opts.Binary = bin
	}
	c := &Cluster{name: opts.Name, dir: dir}
	fail := func(err error) (*Cluster, error) {
		var tails strings.Builder
		for _, n := range c.nodes {
			if n != nil {
				fmt.Fprintf(&tails, "\n---- %s (%s), last lines of its log:\n%s", n.name, n.URL(), n.tail(10))
			}
		}
		c.Close()
		return nil, fmt.Errorf("%w%s", err, tails.String())
	}

	var err error
	for range 3 { // another process may take a port between pick and bind
		if err = c.launch(ctx, opts); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		for _, n := range c.nodes {
			n.kill()
		}
		c.closeLinks()
	}
	if err != nil {
		return fail(fmt.Errorf("natscluster: start: %w", err))
	}

	connOpts := []nats.Option{
		nats.Name("natscluster"), nats.Timeout(2 * time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		// A paused server holds the connection open; find out quickly.
		nats.PingInterval(500 * time.Millisecond), nats.MaxPingsOutstanding(2),
	}
	if len(c.links) > 0 {
		// The harness's own requests (leaders, health) go to a node
		// without a proxied link first, so a delay does not slow them.
		connOpts = append(connOpts, nats.DontRandomize())
	}
	if c.nc, err = nats.Connect(c.adminURLs(), connOpts...); err != nil {
		return fail(fmt.Errorf("natscluster: connect: %w", err))
	}
	if c.sys, err = nats.Connect(c.adminURLs(), append(connOpts, nats.UserInfo(sysUser, sysPassword))...); err != nil {
		return fail(fmt.Errorf("natscluster: connect as system user: %w", err))
	}
	if c.js, err = jetstream.New(c.nc); err != nil {
		return fail(fmt.Errorf("natscluster: %w", err))
	}

	hctx, hcancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer hcancel()
	if err := c.WaitHealthy(hctx); err != nil {
		return fail(fmt.Errorf("natscluster: %w", err))
	}
	if len(c.links) > 0 {
		if err := c.CheckRoutes(hctx); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// Close closes the cluster's own connections and kills every process.
// It is idempotent.
func (c *Cluster) Close() {
	if c.nc != nil {
		c.nc.Close()
	}
	if c.sys != nil {
		c.sys.Close()
	}
	for _, n := range c.nodes {
		if n != nil {
			n.kill()
		}
	}
	c.closeLinks()
}

// launch picks ports, writes each node's configuration and starts the
// processes, and waits until each accepts clients.
func (c *Cluster) launch(ctx context.Context, opts Options) error {
	ports, err := testwait.FreePorts(3 * opts.Nodes)
	if err != nil {
		return err
	}
	c.nodes = make([]*Node, opts.Nodes)
	var routes []string
	for i := range c.nodes {
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(ports[3*i+1]))
	}
	// via[a][b] is the route URL node a dials for node b; advertise the
	// route address every node gossips.
	via := make([][]string, opts.Nodes)
	advertise := ""
	for a := range via {
		via[a] = slices.Clone(routes)
	}
	if len(opts.ProxiedLinks) > 0 {
		if err := checkDeadRoute(); err != nil {
			return err
		}
		advertise = deadRoute
	}
	for _, pair := range opts.ProxiedLinks {
		a, b := pair[0], pair[1]
		if a == b || a < 0 || b < 0 || a >= opts.Nodes || b >= opts.Nodes {
			return fmt.Errorf("natscluster: proxied link %v: want two distinct nodes of %d", pair, opts.Nodes)
		}
		l, err := newLink(a, b, strings.TrimPrefix(routes[a], "nats-route://"), strings.TrimPrefix(routes[b], "nats-route://"))
		if err != nil {
			return err
		}
		c.links = append(c.links, l)
		via[a][b] = "nats-route://" + l.toB.Addr()
		via[b][a] = "nats-route://" + l.toA.Addr()
	}
	for i := range c.nodes {
		dir := filepath.Join(c.dir, "n"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		n := &Node{
			index: i, name: opts.Name + "-" + strconv.Itoa(i), bin: opts.Binary, dir: dir,
			conf: filepath.Join(dir, "nats.conf"), log: filepath.Join(dir, "nats.log"),
			clientPort: ports[3*i], routePort: ports[3*i+1], httpPort: ports[3*i+2],
		}
		if err := os.WriteFile(n.conf, []byte(n.config(opts.Name, via[i], advertise)), 0o644); err != nil {
			return err
		}
		c.nodes[i] = n
	}
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	for _, n := range c.nodes {
		if err := n.waitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

// config is the node's nats-server configuration: loopback only, a
// monitoring port, explicit routes to every node, JetStream in the
// application account, and a system account for the meta step-down.
func (n *Node) config(cluster string, routes []string, advertise string) string {
	adv := ""
	if advertise != "" {
		adv = fmt.Sprintf("  advertise: %q\n", advertise)
	}
	clusterBlock := fmt.Sprintf(`cluster {
  name: %q
  listen: "127.0.0.1:%d"
%s  routes: [%s]
}
`, cluster, n.routePort, adv, strings.Join(routes, ", "))
	if len(routes) == 1 {
		// One node: a plain server, for tests that want nats-server out
		// of the test process (and out of its race detector).
		clusterBlock = ""
	}
	return fmt.Sprintf(`server_name: %q
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
%sjetstream {
  store_dir: %q
  max_memory_store: 256MB
  max_file_store: 4GB
}
accounts {
  SYS: { users: [{ user: %q, password: %q }] }
  APP: { jetstream: enabled, users: [{ user: "app", password: "app" }] }
}
system_account: SYS
no_auth_user: "app"
`, n.name, n.clientPort, n.httpPort, clusterBlock, n.StoreDir(), sysUser, sysPassword)
}

// URLs is every node's client URL, comma-separated, for nats.Connect or a
// worker's --nats.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// adminURLs is URLs with the nodes in no proxied link first.
func (c *Cluster) adminURLs() string {
	var direct, linked []string
	for i, n := range c.nodes {
		if c.linked(i) {
			linked = append(linked, n.URL())
		} else {
			direct = append(direct, n.URL())
		}
	}
	return strings.Join(append(direct, linked...), ",")
}

// linked reports whether node i is in a proxied link.
func (c *Cluster) linked(i int) bool {
	for _, l := range c.links {
		if l.a == i || l.b == i {
			return true
		}
	}
	return false
}

// Nodes returns every node, in index order.
func (c *Cluster) Nodes() []*Node { return append([]*Node(nil), c.nodes...) }

// Node returns node i.
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// NodeNamed returns the node with server name name, or nil.
func (c *Cluster) NodeNamed(name string) *Node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// errNotHealthy wraps what WaitHealthy last saw.
var errNotHealthy = errors.New("natscluster: not healthy")
