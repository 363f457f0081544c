package natscluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoLeader is returned when a Raft group has no leader now, or the
// nodes disagree on it.
var ErrNoLeader = errors.New("natscluster: no leader")

// ErrPaused is returned by WaitHealthy and MetaLeader while a node is
// paused: it cannot answer, and will not until resumed.
var ErrPaused = errors.New("natscluster: node paused")

// pollEvery is how often the waits poll.
const pollEvery = 50 * time.Millisecond

// requestWait bounds one monitoring or API request inside a wait.
const requestWait = 2 * time.Second

// MetaLeader returns the meta leader, as every running node reports it on
// its monitoring endpoint (/jsz); they must agree. A paused node is an
// error (ErrPaused); a stopped one is left out.
func (c *Cluster) MetaLeader(ctx context.Context) (*Node, error) {
	leader := ""
	asked := 0
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		if n.Paused() {
			return nil, fmt.Errorf("%w: %s", ErrPaused, n.name)
		}
		jsz, err := n.jsz(ctx)
		if err != nil {
			return nil, err
		}
		asked++
		if jsz.Meta == nil || jsz.Meta.Leader == "" {
			return nil, fmt.Errorf("%w: %s knows no meta leader", ErrNoLeader, n.name)
		}
		if leader != "" && jsz.Meta.Leader != leader {
			return nil, fmt.Errorf("%w: nodes name meta leaders %s and %s", ErrNoLeader, leader, jsz.Meta.Leader)
		}
		leader = jsz.Meta.Leader
	}
	if asked == 0 {
		return nil, fmt.Errorf("%w: no node running", ErrNoLeader)
	}
	return c.leaderNode("meta", leader)
}

// StreamLeader returns the leader of stream, from its stream info.
func (c *Cluster) StreamLeader(ctx context.Context, stream string) (*Node, error) {
	ctx, cancel := context.WithTimeout(ctx, requestWait)
	defer cancel()
	s, err := c.js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("natscluster: stream %s: %w", stream, err)
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return nil, fmt.Errorf("%w: stream %s has no cluster info", ErrNoLeader, stream)
	}
	return c.leaderNode("stream "+stream, info.Cluster.Leader)
}

// ConsumerLeader returns the leader of a consumer, as the node that leads
// it reports (ConsumerPeers: a consumer info request may be answered by a
// member without cluster information).
func (c *Cluster) ConsumerLeader(ctx context.Context, stream, consumer string) (*Node, error) {
	_, leader, _, err := c.ConsumerPeers(ctx, stream, consumer)
	if err != nil {
		return nil, err
	}
	return c.leaderNode("consumer "+stream+"/"+consumer, leader)
}

func (c *Cluster) leaderNode(group, name string) (*Node, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoLeader, group)
	}
	n := c.NodeNamed(name)
	if n == nil {
		return nil, fmt.Errorf("natscluster: %s leader %q is not a node of this cluster", group, name)
	}
	return n, nil
}

// WaitStreamLeader waits until stream has a leader other than not (nil:
// any leader) and returns it.
func (c *Cluster) WaitStreamLeader(ctx context.Context, stream string, not *Node) (*Node, error) {
	return waitLeader(ctx, not, func(ctx context.Context) (*Node, error) { return c.StreamLeader(ctx, stream) })
}

// WaitConsumerLeader waits until the consumer has a leader other than not
// (nil: any leader) and returns it.
func (c *Cluster) WaitConsumerLeader(ctx context.Context, stream, consumer string, not *Node) (*Node, error) {
	return waitLeader(ctx, not, func(ctx context.Context) (*Node, error) { return c.ConsumerLeader(ctx, stream, consumer) })
}

// WaitMetaLeader waits until the nodes agree on a meta leader other than
// not (nil: any leader) and returns it.
func (c *Cluster) WaitMetaLeader(ctx context.Context, not *Node) (*Node, error) {
	return waitLeader(ctx, not, c.MetaLeader)
}

func waitLeader(ctx context.Context, not *Node, leader func(context.Context) (*Node, error)) (*Node, error) {
	for {
		n, err := leader(ctx)
		if err == nil && n != not {
			return n, nil
		}
		if err == nil {
			err = fmt.Errorf("%w: still %s", ErrNoLeader, n.name)
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(pollEvery): // polling with the caller's deadline
		}
	}
}

// StepDownMeta asks the meta leader to step down (a system account
// request) and waits until the nodes agree on another one, which it
// returns.
func (c *Cluster) StepDownMeta(ctx context.Context) (*Node, error) {
	old, err := c.WaitMetaLeader(ctx, nil)
	if err != nil {
		return nil, err
	}
	if err := stepDown(ctx, c.sys, "$JS.API.META.LEADER.STEPDOWN"); err != nil {
		return nil, err
	}
	return c.WaitMetaLeader(ctx, old)
}

// StepDownStream asks the leader of stream to step down and waits until
// another node leads it, which it returns.
func (c *Cluster) StepDownStream(ctx context.Context, stream string) (*Node, error) {
	old, err := c.WaitStreamLeader(ctx, stream, nil)
	if err != nil {
		return nil, err
	}
	if err := stepDown(ctx, c.nc, "$JS.API.STREAM.LEADER.STEPDOWN."+stream); err != nil {
		return nil, err
	}
	return c.WaitStreamLeader(ctx, stream, old)
}

// MoveStreamLeader makes node to the leader of stream: unless it leads
// already, the leader is asked to step down in its favour (a preferred
// placement, nats-server 2.11+), and MoveStreamLeader waits until it does.
func (c *Cluster) MoveStreamLeader(ctx context.Context, stream string, to *Node) error {
	return c.moveLeader(ctx, "stream "+stream, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, to,
		func(ctx context.Context) (*Node, error) { return c.StreamLeader(ctx, stream) })
}

// MoveConsumerLeader is MoveStreamLeader for a consumer.
func (c *Cluster) MoveConsumerLeader(ctx context.Context, stream, consumer string, to *Node) error {
	return c.moveLeader(ctx, "consumer "+stream+"/"+consumer, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer, to,
		func(ctx context.Context) (*Node, error) { return c.ConsumerLeader(ctx, stream, consumer) })
}

func (c *Cluster) moveLeader(ctx context.Context, group, subject string, to *Node, leader func(context.Context) (*Node, error)) error {
	cur, err := waitLeader(ctx, nil, leader)
	if err != nil {
		return err
	}
	if cur == to {
		return nil
	}
	// A preferred peer that is not quite current is passed over; a few
	// tries, each waiting for the election it started.
	body := fmt.Sprintf(`{"placement":{"preferred":%q}}`, to.name)
	for try := 1; ; try++ {
		if err := stepDownWith(ctx, c.nc, subject, []byte(body)); err != nil && try == moveTries {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, moveWait)
		_, err = waitLeader(wctx, nil, func(ctx context.Context) (*Node, error) {
			n, err := leader(ctx)
			if err == nil && n != to {
				err = fmt.Errorf("%w: %s leads %s, want %s", ErrNoLeader, n.name, group, to.name)
			}
			return n, err
		})
		cancel()
		if err == nil || try == moveTries || ctx.Err() != nil {
			return err
		}
	}
}

// Bounds of MoveStreamLeader.
const (
	moveTries = 5
	moveWait  = 5 * time.Second
)

// StepDownConsumer asks the leader of a consumer to step down and waits
// until another node leads it, which it returns. A step-down the server
// accepted whose consumer is still led by the same node moveWait later
// (the same node elected again, or the consumer re-created there by its
// owner meanwhile: a loaded CI run of e2e TestClusterSale waited its 3
// minutes on one) is asked again, at most moveTries times.
func (c *Cluster) StepDownConsumer(ctx context.Context, stream, consumer string) (*Node, error) {
	var last error
	for range moveTries {
		old, err := c.WaitConsumerLeader(ctx, stream, consumer, nil)
		if err != nil {
			return nil, err
		}
		if err := stepDown(ctx, c.nc, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer); err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, moveWait)
		n, err := c.WaitConsumerLeader(wctx, stream, consumer, old)
		cancel()
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		last = err
	}
	return nil, last
}

// stepDown makes a step-down request and maps its API error.
func stepDown(ctx context.Context, nc *nats.Conn, subject string) error {
	return stepDownWith(ctx, nc, subject, nil)
}

// stepDownWith is stepDown with a request body.
func stepDownWith(ctx context.Context, nc *nats.Conn, subject string, body []byte) error {
	rctx, cancel := context.WithTimeout(ctx, requestWait)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return fmt.Errorf("natscluster: %s: %w", subject, err)
	}
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("natscluster: %s: %w (%q)", subject, err, msg.Data)
	}
	if resp.Error != nil {
		return fmt.Errorf("natscluster: %s: %s (code %d, err_code %d)", subject, resp.Error.Description, resp.Error.Code, resp.Error.ErrCode)
	}
	if !resp.Success {
		return fmt.Errorf("natscluster: %s: no success in %q", subject, msg.Data)
	}
	return nil
}

// jszReply is the part of a node's /jsz the harness reads.
type jszReply struct {
	Meta *struct {
		Leader   string `json:"leader"`
		Replicas []struct {
			Name    string `json:"name"`
			Current bool   `json:"current"`
			Offline bool   `json:"offline"`
		} `json:"replicas"`
	} `json:"meta_cluster"`
}

func (n *Node) jsz(ctx context.Context) (jszReply, error) {
	var r jszReply
	err := n.monitor(ctx, "/jsz", &r)
	return r, err
}

// monitorClient keeps no idle connections: a test that checks for leaked
// goroutines finds none of its.
var monitorClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// monitor GETs a monitoring endpoint of the node and decodes its JSON.
func (n *Node) monitor(ctx context.Context, path string, v any) error {
	return n.monitorWithin(ctx, path, v, requestWait)
}

// monitorWithin is monitor with its own bound: a full /jsz with every
// consumer takes a loaded server longer than a health check.
func (n *Node) monitorWithin(ctx context.Context, path string, v any, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.MonitorURL()+path, nil)
	if err != nil {
		return err
	}
	resp, err := monitorClient.Do(req)
	if err != nil {
		return fmt.Errorf("natscluster: %s %s: %w", n.name, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("natscluster: %s %s: %w", n.name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("natscluster: %s %s: %s: %s", n.name, path, resp.Status, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("natscluster: %s %s: %w", n.name, path, err)
	}
	return nil
}

// healthBucket is the bucket WaitHealthy makes and removes to prove that
// JetStream can place and replicate an asset.
const healthBucket = "NATSCLUSTER_HEALTH"

// WaitHealthy waits until every node runs and reports itself healthy
// (/healthz: JetStream on, meta and every asset it holds current), the
// nodes agree on a meta leader, and a bucket with one replica per node can
// be created, written and deleted. A node that is not running or is
// paused fails it at once (ErrNotRunning, ErrPaused): it cannot get well
// by waiting.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	for {
		err := c.healthy(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrNotRunning) || errors.Is(err, ErrPaused) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%w: %w", errNotHealthy, err), ctx.Err())
		case <-time.After(pollEvery): // polling with the caller's deadline
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) error {
	for _, n := range c.nodes {
		if !n.Running() {
			return fmt.Errorf("%w: %s", ErrNotRunning, n.name)
		}
		if n.Paused() {
			return fmt.Errorf("%w: %s", ErrPaused, n.name)
		}
		var h struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := n.monitor(ctx, "/healthz", &h); err != nil {
			return err
		}
		if h.Status != "ok" {
			return fmt.Errorf("natscluster: %s health %s: %s", n.name, h.Status, h.Error)
		}
	}
	if len(c.nodes) == 1 {
		return nil // a plain server: no meta group
	}
	leader, err := c.MetaLeader(ctx)
	if err != nil {
		return err
	}
	// The meta leader places assets only on peers it sees online and
	// current; right after a start or an election it may not yet.
	jsz, err := leader.jsz(ctx)
	if err != nil {
		return err
	}
	if jsz.Meta == nil || len(jsz.Meta.Replicas) != len(c.nodes)-1 {
		return fmt.Errorf("natscluster: meta leader %s does not yet see %d peers: %+v", leader.name, len(c.nodes)-1, jsz.Meta)
	}
	for _, p := range jsz.Meta.Replicas {
		if !p.Current || p.Offline {
			return fmt.Errorf("natscluster: meta leader %s sees peer %s current=%t offline=%t", leader.name, p.Name, p.Current, p.Offline)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*requestWait)
	defer cancel()
	kv, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: healthBucket, Replicas: len(c.nodes), Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("natscluster: create R%d bucket: %w", len(c.nodes), err)
	}
	if _, err := kv.Put(ctx, "probe", []byte("ok")); err != nil {
		return fmt.Errorf("natscluster: write R%d bucket: %w", len(c.nodes), err)
	}
	if err := c.js.DeleteKeyValue(ctx, healthBucket); err != nil {
		return fmt.Errorf("natscluster: delete R%d bucket: %w", len(c.nodes), err)
	}
	return nil
}

// jszConsumers is the part of a node's /jsz?consumers=true the harness
// reads: each consumer the node hosts, as the node sees it.
type jszConsumers struct {
	Accounts []struct {
		Streams []struct {
			Name      string `json:"name"`
			Consumers []struct {
				Name   string `json:"name"`
				Config struct {
					Replicas int `json:"num_replicas"`
				} `json:"config"`
				Cluster *struct {
					Leader   string `json:"leader"`
					Replicas []struct {
						Name string `json:"name"`
					} `json:"replicas"`
				} `json:"cluster"`
			} `json:"consumer_detail"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

// ConsumerPeers reports a consumer as the node that leads it sees it, from
// the monitoring endpoint of every running node: its configured replicas,
// its leader, and how many peers it has (the leader included). Consumer
// info requests are no substitute: any member of the consumer's group may
// answer them, and one that has not yet started its Raft node answers
// without cluster information. ErrNoLeader if no node leads it.
func (c *Cluster) ConsumerPeers(ctx context.Context, stream, consumer string) (replicas int, leader string, peers int, err error) {
	var errs []error
	for _, n := range c.nodes {
		if !n.Running() || n.Paused() {
			continue
		}
		var r jszConsumers
		// A node that does not answer in time (a loaded machine) is
		// skipped: another node may lead the consumer.
		if err := n.monitorWithin(ctx, "/jsz?accounts=true&streams=true&consumers=true&config=true", &r, 3*requestWait); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range r.Accounts {
			for _, s := range a.Streams {
				if s.Name != stream {
					continue
				}
				for _, cons := range s.Consumers {
					if cons.Name == consumer && cons.Cluster != nil && cons.Cluster.Leader == n.name {
						return cons.Config.Replicas, n.name, 1 + len(cons.Cluster.Replicas), nil
					}
				}
			}
		}
	}
	err = fmt.Errorf("%w: consumer %s/%s", ErrNoLeader, stream, consumer)
	if len(errs) > 0 {
		err = errors.Join(err, errors.Join(errs...))
	}
	return 0, "", 0, err
}
