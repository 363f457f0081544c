package natscluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/keylane/keylane/internal/faultproxy"
)

// Link is the route traffic between two nodes of a cluster started with
// Options.ProxiedLinks, through two fault proxies: one that node A dials
// to reach node B, one that node B dials to reach node A (nats-server
// pools several route connections per pair and either side may dial).
// Its methods are safe for concurrent use.
type Link struct {
	a, b int
	toB  *faultproxy.Proxy // A dials it; upstream carries A to B
	toA  *faultproxy.Proxy // B dials it; upstream carries B to A
}

// deadRoute is the route address every node of a cluster with proxied
// links advertises: nothing listens on it (checkDeadRoute), so the routes
// a node would make from gossip fail at once, and an implicit route is
// not retried (nats-server's cluster connect_retries defaults to 0).
//
// A node tells its peers where to reach it for routes, and a peer that
// hears of a node it has no route to yet dials that address (an implicit
// route; nats-server gossips a new route's INFO to the other routes).
// Only the node's own route address or a proxy can be advertised, and
// either is wrong for some peer. The proxy in front of node 2 (the link
// 0-2), gossiped to node 1 while node 1's own route to node 2 was still
// being made, gave node 1 a route to node 2 through the link: what node 1
// sent node 2 was delayed with what node 0 sent, and the direct gets of
// TestProxiedLinkDelaysReplication from node 1 reached node 2 as late as
// node 0's replication did, always answered current (about one start in
// six on a loaded machine, each pooled or per-account route a separate
// race). Node 2's own address, gossiped to node 0, gives node 0 a route
// around the link, and a delay that delays nothing.
const deadRoute = "127.0.0.1:1"

// checkDeadRoute returns an error unless a dial of deadRoute is refused.
func checkDeadRoute() error {
	conn, err := net.DialTimeout("tcp", deadRoute, 2*time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("natscluster: %s accepts connections; proxied links need it to refuse them (the route address every node advertises)", deadRoute)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("natscluster: a dial of %s, the route address every node advertises, must be refused: %w", deadRoute, err)
	}
	return nil
}

func newLink(a, b int, routeA, routeB string) (*Link, error) {
	toB, err := faultproxy.New(routeB)
	if err != nil {
		return nil, err
	}
	toA, err := faultproxy.New(routeA)
	if err != nil {
		toB.Close()
		return nil, err
	}
	return &Link{a: a, b: b, toB: toB, toA: toA}, nil
}

// Link returns the proxied link between nodes a and b (either order), or
// nil if Options.ProxiedLinks did not name it.
func (c *Cluster) Link(a, b int) *Link {
	for _, l := range c.links {
		if l.a == a && l.b == b || l.a == b && l.b == a {
			return l
		}
	}
	return nil
}

// Delay delays every byte node from sends to node to (the other end of
// the link) by d more, on every route connection between them, now and
// later; the other direction is untouched. Delays add up: raising a delay
// in steps leaves the receiver a gap of one step at a time instead of one
// of the whole delay (a Raft follower that hears nothing for its election
// timeout campaigns). The returned func removes this delay.
func (l *Link) Delay(from, to int, d time.Duration) (remove func(), err error) {
	var up, down *faultproxy.Proxy // the proxy whose upstream, downstream carries from→to
	switch {
	case from == l.a && to == l.b:
		up, down = l.toB, l.toA
	case from == l.b && to == l.a:
		up, down = l.toA, l.toB
	default:
		return nil, fmt.Errorf("natscluster: no link from node %d to node %d", from, to)
	}
	t1, err := up.Latency(faultproxy.Upstream, d, 0)
	if err != nil {
		return nil, err
	}
	t2, err := down.Latency(faultproxy.Downstream, d, 0)
	if err != nil {
		t1.Remove()
		return nil, err
	}
	return func() { t1.Remove(); t2.Remove() }, nil
}

// Ramp raises the delay from node from to node to by total, in steps of
// step each a step apart (see Delay: each leaves a gap of one step), and
// returns once the whole delay is on, or ctx ended (having removed what
// it added). The returned func removes the whole delay.
func (l *Link) Ramp(ctx context.Context, from, to int, total, step time.Duration) (remove func(), err error) {
	var removes []func()
	removeAll := func() {
		for _, r := range removes {
			r()
		}
	}
	for added := time.Duration(0); added < total; added += step {
		if added > 0 {
			t := time.NewTimer(step)
			select {
			case <-ctx.Done():
				t.Stop()
				removeAll()
				return nil, ctx.Err()
			case <-t.C:
			}
		}
		r, err := l.Delay(from, to, min(step, total-added))
		if err != nil {
			removeAll()
			return nil, err
		}
		removes = append(removes, r)
	}
	return removeAll, nil
}

func (l *Link) close() {
	l.toB.Close()
	l.toA.Close()
}

func (c *Cluster) closeLinks() {
	for _, l := range c.links {
		l.close()
	}
	c.links = nil
}

// AnswersDirectGets reports whether the node's replica of stream is in
// the stream's direct-get group: a follower joins once it has caught up
// (nats-server checks on a timer after it starts or a stream is made),
// and the node's own clients' direct gets are answered by it from then
// on (the server prefers a local member of the queue group).
func (n *Node) AnswersDirectGets(ctx context.Context, stream string) (bool, error) {
	var r struct {
		Subs []struct {
			Subject string `json:"subject"`
			Queue   string `json:"qgroup"`
		} `json:"subscriptions_list"`
	}
	subject := "$JS.API.DIRECT.GET." + stream
	if err := n.monitor(ctx, "/subsz?subs=1&test="+url.QueryEscape(subject), &r); err != nil {
		return false, err
	}
	for _, s := range r.Subs {
		if s.Subject == subject && s.Queue != "" {
			return true, nil
		}
	}
	return false, nil
}

// StreamLastSeq returns the last sequence of the node's own replica of
// stream, from its monitoring endpoint (/jsz): what the node has applied,
// which on a follower trails the leader.
func (n *Node) StreamLastSeq(ctx context.Context, stream string) (uint64, error) {
	var r struct {
		Accounts []struct {
			Streams []struct {
				Name  string `json:"name"`
				State struct {
					LastSeq uint64 `json:"last_seq"`
				} `json:"state"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := n.monitor(ctx, "/jsz?accounts=true&streams=true", &r); err != nil {
		return 0, err
	}
	for _, a := range r.Accounts {
		for _, s := range a.Streams {
			if s.Name == stream {
				return s.State.LastSeq, nil
			}
		}
	}
	return 0, fmt.Errorf("natscluster: %s has no replica of stream %s", n.name, stream)
}

// CheckRoutes returns an error unless every route connection between two
// running nodes goes where Options.ProxiedLinks says: through the link's
// proxies between the two nodes of a link (each dialing the proxy in
// front of the other), directly between any other two. A route that
// escapes its link carries that pair's traffic without the delay (a test
// of a lagging replica passes without one); a route from a third node
// through a link's proxy delays what the third node sends.
//
// It reads every running, unpaused node's /routez, every pooled and
// per-account route included. The node that dialed a connection sees the
// address it dialed there, a node's route port or a proxy's; the node that
// accepted it sees the dialer's ephemeral port, which says nothing, and is
// skipped: each connection is judged once, on the side that dialed.
func (c *Cluster) CheckRoutes(ctx context.Context) error {
	var errs []error
	for _, n := range c.nodes {
		if !n.Running() || n.Paused() {
			continue
		}
		var r struct {
			Routes []struct {
				RemoteName string `json:"remote_name"`
				IP         string `json:"ip"`
				Port       int    `json:"port"`
				Account    string `json:"account"`
			} `json:"routes"`
		}
		if err := n.monitor(ctx, "/routez", &r); err != nil {
			return err
		}
		for _, rt := range r.Routes {
			peer := c.NodeNamed(rt.RemoteName)
			if peer == nil {
				continue
			}
			if err := c.checkRoute(n.index, peer.index, net.JoinHostPort(rt.IP, strconv.Itoa(rt.Port))); err != nil {
				if rt.Account != "" {
					err = fmt.Errorf("%w (the route of account %s)", err, rt.Account)
				}
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrRouteEscapesLink, errors.Join(errs...))
	}
	return nil
}

// ErrRouteEscapesLink is returned by CheckRoutes.
var ErrRouteEscapesLink = errors.New("natscluster: a route does not go where the proxied links say")

// checkRoute judges a route connection node from has to node to, whose
// other end is at addr from from's side.
func (c *Cluster) checkRoute(from, to int, addr string) error {
	linked := c.Link(from, to) != nil
	if addr == c.nodes[to].routeAddr() {
		if linked {
			return fmt.Errorf("node %d dials node %d directly, not through their proxied link", from, to)
		}
		return nil
	}
	for _, l := range c.links {
		for _, p := range []struct {
			proxy          string
			dialer, target int
		}{{l.toB.Addr(), l.a, l.b}, {l.toA.Addr(), l.b, l.a}} {
			if addr == p.proxy && (from != p.dialer || to != p.target) {
				return fmt.Errorf("node %d dials node %d through the proxy for %d→%d of the link %d-%d", from, to, p.dialer, p.target, l.a, l.b)
			}
		}
	}
	return nil
}

// routeAddr is the address the node listens on for routes.
func (n *Node) routeAddr() string { return "127.0.0.1:" + strconv.Itoa(n.routePort) }
