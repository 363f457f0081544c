package natscluster

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestGossipOpensNoRouteThroughALink: a node that hears of a peer it has
// no route to (nats-server sends a new route's INFO to its other routes)
// dials the route address the peer advertises. With the links 0-2 and
// 1-2 and the link 1-2 cut, node 1 has no route to node 2; the link 0-2
// is cut and restored, and node 0, routed to node 2 again, tells node 1 of
// it. Node 1 must still have no route to node 2: one through the link 0-2
// carries what node 1 sends node 2 with the delay meant for node 0.
// Before, node 2 advertised the proxy of the link 0-2 that leads to it,
// and node 1 dialed it: CheckRoutes found "node 1 dials node 2 through
// the proxy for 0→2 of the link 0-2". At a start the same gossip races
// node 1's own route to node 2; this makes node 1 lose the race.
func TestGossipOpensNoRouteThroughALink(t *testing.T) {
	c := Start(t, Options{ProxiedLinks: [][2]int{{0, 2}, {1, 2}}})
	check := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := c.CheckRoutes(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	check("after the start")
	cut := func(l *Link) {
		l.toA.Cut()
		l.toB.Cut()
	}
	restore := func(l *Link) {
		t.Helper()
		if err := l.toA.Restore(); err != nil {
			t.Fatal(err)
		}
		if err := l.toB.Restore(); err != nil {
			t.Fatal(err)
		}
	}
	link02, link12 := c.Link(0, 2), c.Link(1, 2)
	cut(link12)
	testwait.Eventually(t, 30*time.Second, "node 1 has no route to node 2 with their link cut", func() bool { return c.routes(t, 1, 2) == 0 })

	cut(link02)
	testwait.Eventually(t, 30*time.Second, "node 0 has no route to node 2 with their link cut", func() bool { return c.routes(t, 0, 2) == 0 })
	logged := logSize(t, c.Node(1))
	restore(link02)
	testwait.Eventually(t, 30*time.Second, "node 0 routed to node 2 again", func() bool { return c.routes(t, 0, 2) > 0 })
	// Node 1 acts on the gossip at once: it either dials the address
	// advertised (refused, and it says so in its log) or has a route.
	testwait.Eventually(t, 30*time.Second, "node 1 dialed what node 0 gossiped of node 2", func() bool {
		return c.routes(t, 1, 2) > 0 || strings.Contains(logSince(t, c.Node(1), logged), deadRoute)
	})
	check("after node 0 gossiped node 2 to node 1")
	if n := c.routes(t, 1, 2); n > 0 {
		t.Fatalf("node 1 has %d routes to node 2 with their link cut", n)
	}

	restore(link12)
	testwait.Eventually(t, 30*time.Second, "node 1 routed to node 2 again", func() bool { return c.routes(t, 1, 2) > 0 })
	if err := c.WaitHealthy(ctxFor(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	check("after the link 1-2 is restored")
}

// routes returns how many routes node from lists to node to.
func (c *Cluster) routes(t *testing.T, from, to int) int {
	t.Helper()
	var r struct {
		Routes []struct {
			RemoteName string `json:"remote_name"`
		} `json:"routes"`
	}
	if err := c.nodes[from].monitor(t.Context(), "/routez", &r); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rt := range r.Routes {
		if rt.RemoteName == c.nodes[to].name {
			n++
		}
	}
	return n
}

func logSize(t *testing.T, n *Node) int64 {
	t.Helper()
	fi, err := os.Stat(n.Log())
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func logSince(t *testing.T, n *Node, offset int64) string {
	t.Helper()
	b, err := os.ReadFile(n.Log())
	if err != nil {
		t.Fatal(err)
	}
	return string(b[offset:])
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
