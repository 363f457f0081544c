package keylane

import (
	"context"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
)

// proxiedClient returns a client whose connection runs through a fault
// proxy in front of the test's server.
func (e *env) proxiedClient() (*Client, *nats.Conn, *faultproxy.Proxy) {
	e.t.Helper()
	return e.proxiedClientWith(ClientConfig{})
}

// proxiedClientWith is proxiedClient with cfg (its Namespace is the env's).
func (e *env) proxiedClientWith(cfg ClientConfig) (*Client, *nats.Conn, *faultproxy.Proxy) {
	e.t.Helper()
	nc, p := proxiedConn(e.t, e.srv.ClientURL())
	cfg.Namespace = e.ns
	c, err := NewClient(ctx(e.t), nc, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Close)
	return c, nc, p
}

// TestCallRepublishesALostPublish: the job's publish never reaches the
// server (swallowed on the way). Call must publish it again, with the same
// job ID, instead of waiting for its deadline.
func TestCallRepublishesALostPublish(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer })
	e.waitOwned(w)
	c, nc, p := e.proxiedClient()
	swallow, err := p.Timeout(faultproxy.Upstream, 0)
	if err != nil {
		t.Fatal(err)
	}
	sent := nc.Stats().OutMsgs
	done := make(chan error, 1)
	var res []byte
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var err error
		res, err = c.Call(cctx, "k", nil)
		done <- err
	}()
	testwait.Eventually(t, 5*time.Second, "the job published (and swallowed)", func() bool { return nc.Stats().OutMsgs > sent })
	swallow.Remove()
	select {
	case err := <-done:
		if err != nil || string(res) != "1" {
			t.Fatalf("call = %q, %v; want 1", res, err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Call never published the lost job again")
	}
	if got, _ := NewState(e.topo.State).Get(ctx(t), "k"); string(got.Value) != "1" {
		t.Fatalf("value %q: the job applied %s times", got.Value, got.Value)
	}
}

// TestCallRecoversALostReply: the worker replies while the caller's
// connection is down. Call must get the outcome once it is back, from the
// outcome the worker kept, instead of waiting for its deadline.
func TestCallRecoversALostReply(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	gated := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return countReducer(ctx, job, cur)
	})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, gated })
	e.waitOwned(w)
	c, _, p := e.proxiedClient()
	done := make(chan error, 1)
	var res []byte
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var err error
		res, err = c.Call(cctx, "k", nil)
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never ran the job")
	}
	p.Cut()
	close(release)
	testwait.Eventually(t, 10*time.Second, "the job finished and was answered into the void", func() bool { return w.Stats().Succeeded == 1 })
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || string(res) != "1" {
			t.Fatalf("call = %q, %v; want 1", res, err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Call never recovered the reply it lost")
	}
}

// TestSubmitRepublishesALostPublish: Submit's publish is lost on the way;
// Submit publishes it again (same job ID) instead of failing a job the
// caller would then retry blind.
func TestSubmitRepublishesALostPublish(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	c, nc, p := e.proxiedClient()
	swallow, err := p.Timeout(faultproxy.Upstream, 0)
	if err != nil {
		t.Fatal(err)
	}
	sent := nc.Stats().OutMsgs
	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := c.Submit(cctx, "k", nil, WithID("lost-once"))
		done <- err
	}()
	testwait.Eventually(t, 5*time.Second, "the job published (and swallowed)", func() bool { return nc.Stats().OutMsgs > sent })
	swallow.Remove()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("submit = %v", err)
		}
	case <-time.After(18 * time.Second):
		t.Fatal("Submit never published the lost job again")
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 1 {
		t.Fatalf("%d jobs stored, want 1", n)
	}
}

// TestSubmitWhoseAckWasLostIsNoDuplicate: the stream stores a job, its ack
// is lost, and Submit's copy is answered "duplicate". That duplicate is
// Submit's own first copy: the job was stored once, by this call, and
// Submit must say so (nil), not ErrDuplicate ("stored before, nothing
// new"), which a shop would read as a failed order and retry under a new
// ID.
func TestSubmitWhoseAckWasLostIsNoDuplicate(t *testing.T) {
	submitWhoseAckWasLost(t)
}

// submitWhoseAckWasLost: the batch message's resend is answered
// "duplicate" (the batch was stored), and Submit must not report that as
// ErrDuplicate.
func submitWhoseAckWasLost(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	c, _, p := e.proxiedClientWith(ClientConfig{})
	swallow, err := p.Timeout(faultproxy.Downstream, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.Submit(cctx, "k", nil)
		done <- err
	}()
	testwait.Eventually(t, 5*time.Second, "the job stored (its ack swallowed)", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 1 })
	swallow.Remove()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("submit = %v; want nil: the only earlier copy was its own", err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("Submit never settled after its ack was lost")
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 1 {
		t.Fatalf("%d jobs stored, want 1", n)
	}
}
