package natscluster

import (
	"context"
	"fmt"
	"net/url"
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
