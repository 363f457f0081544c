package e2e

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// faultAckWait is the workers' AckWait in the fault tests: a lost delivery
// comes back after it, so it bounds how long they take.
const faultAckWait = 2 * time.Second

// keyLoad runs n goroutines, each making perCaller ops on key through h:
// mostly "buy 1" Calls, and every tenth a "restock 2" Submit. It returns
// when all are done; stop (if not nil) ends it early.
func keyLoad(h *history, key string, n, perCaller int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	wg.Add(n)
	for g := range n {
		go func() {
			defer wg.Done()
			for i := range perCaller {
				select {
				case <-stop:
					return
				default:
				}
				if (g+i)%10 == 5 {
					h.submit(key, "restock 2")
				} else {
					h.call(key, "buy 1")
				}
			}
		}()
	}
	wg.Wait()
}

// settle waits until the namespace's stream is empty (every job acked or
// dead-lettered, lost deliveries come back after AckWait), then reads the
// keys' stock with a recorded "get".
func settle(t *testing.T, c *cluster, h *history, keys []string, timeout time.Duration) map[string]int64 {
	t.Helper()
	if err := testwait.Poll(timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := c.client.Backlog(ctx)
		if err == nil && n > 0 {
			err = fmt.Errorf("%d jobs left", n)
		}
		return err
	}); err != nil {
		logLeft(t, c)
		t.Fatalf("jobs stream not empty: %v", err)
	}
	final := map[string]int64{}
	for _, k := range keys {
		o := h.call(k, "get")
		if o.Err != nil {
			t.Fatalf("final get of %s: %v", k, o.Err)
		}
		n, err := strconv.ParseInt(o.Reply[len("stock "):], 10, 64)
		if !wellFormed("get", o.Reply) || err != nil {
			t.Fatalf("final get of %s: reply %q", k, o.Reply)
		}
		final[k] = n
	}
	return final
}

// checkCluster stops the workers (so their traces are complete) and checks
// the history against them.
func checkCluster(t *testing.T, c *cluster, h *history, final map[string]int64, rules historyRules) {
	t.Helper()
	c.stopGraceful(15 * time.Second)
	rep := checkHistory(t, h.all(), readTraces(t, c.traceFiles()), final, rules)
	t.Logf("history: %s", rep)
}

// TestStrayPullerLosesNoJob: while one worker owns the partition of a hot
// key, a plain JetStream client pulls one message from the partition's
// consumer ("p<p>", fetch 1) and never acks it, as a deposed owner's
// iterator that is still alive would (consumers are addressed by name and
// the successor re-creates the same name). The server redelivers that job
// after AckWait, by when later jobs of its key have been applied. keylane
// promises (DESIGN.md, "No gaps") that such a missing delivery never turns
// into a silent success: every acknowledged job must still apply exactly
// once, in stream order, and every caller get its own correct result.
func TestStrayPullerLosesNoJob(t *testing.T) {
	c := startCluster(t, "e2e-stray", 1, "--ack-wait", faultAckWait.String())
	const key = "stray:0"
	h := newHistory("stray", func() *keylane.Client { return c.client })
	if o := h.call(key, "set 1000"); o.Err != nil || o.Reply != "ok 1000" {
		t.Fatalf("set: %v", o)
	}
	// The set ran, so the partition's consumer exists and the owner pulls.

	nc, err := nats.Connect(natsURL, nats.Name("e2e-stray-puller"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cons, err := js.Consumer(ctx, c.names.Jobs(), c.names.Consumer(partition.Of(key, partitions)))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	type stolen struct {
		id  string
		seq uint64
		err error
	}
	stray := make(chan stolen, 1)
	go func() {
		// The server hands waiting pull requests messages in turn, so this
		// one gets one of the first few jobs.
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(20*time.Second))
		if err != nil {
			stray <- stolen{err: err}
			return
		}
		for m := range batch.Messages() {
			meta, _ := m.Metadata()
			s := stolen{id: m.Headers().Get(keylane.HeaderJobID)}
			if meta != nil {
				s.seq = meta.Sequence.Stream
			}
			stray <- s // never acked
			return
		}
		stray <- stolen{err: errors.Join(errors.New("fetch returned no message"), batch.Error())}
	}()
	// Let the stray request reach the server before the jobs do.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testwait.NoError(t, 5*time.Second, "the stray pull request did not show up at the consumer", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := cons.Info(ctx)
		if err == nil && info.NumWaiting < 2 {
			err = fmt.Errorf("info %+v", info)
		}
		return err
	})

	start := time.Now()
	keyLoad(h, key, 4, 25, nil)
	s := <-stray
	if s.err != nil {
		t.Fatalf("stray puller: %v", s.err)
	}
	t.Logf("stray puller took job %s (seq %d); %d ops in %s", s.id, s.seq, len(h.all()), time.Since(start).Round(time.Millisecond))
	for _, o := range h.all() {
		if o.ID == s.id {
			t.Logf("the stolen job's caller saw: %s", o)
		}
	}
	final := settle(t, c, h, []string{key}, 30*time.Second)
	checkCluster(t, c, h, final, historyRules{strictOverlap: true})
}

// TestWorkerConnectionCutMidDelivery: the only worker reaches the server
// through a fault proxy. The proxy swallows what the server sends for a
// moment and then cuts the connection: deliveries the server counted as
// made are lost in the socket. The worker reconnects within its lease window and keeps
// pulling, so later jobs of the same key run first; the lost ones come
// back after AckWait. keylane promises that this loses nothing: every
// acknowledged job applies exactly once, in stream order, with its own
// result.
func TestWorkerConnectionCutMidDelivery(t *testing.T) {
	proxy, err := faultproxy.New(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	c := startCluster(t, "e2e-cut", 1, "--ack-wait", faultAckWait.String(), "--nats", proxy.URL())
	const key = "cut:0"
	h := newHistory("cut", func() *keylane.Client { return c.client })
	if o := h.call(key, "set 100000"); o.Err != nil || o.Reply != "ok 100000" {
		t.Fatalf("set: %v", o)
	}

	stop := make(chan struct{})
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		keyLoad(h, key, 8, 1<<20, stop)
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-loadDone
	}()

	// Three cuts. Before each, a timeout toxic swallows what the server
	// sends the worker for a moment: deliveries the server counts as made
	// that the worker never reads. The cut then drops the connection, and
	// it heals well inside the lease TTL. A latency toxic would hold the
	// deliveries as well, but toxiproxy leaks its goroutines when a cut
	// kills a link it holds data for.
	const cuts = 3
	for i := range cuts {
		waitOps(t, h, len(h.all())+200, 30*time.Second)
		swallow, err := proxy.Timeout(faultproxy.Downstream, 0)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 100*time.Millisecond)
		proxy.Cut()
		cutAt := time.Now()
		swallow.Remove()
		waitFor(t, 300*time.Millisecond)
		if err := proxy.Restore(); err != nil {
			t.Fatal(err)
		}
		t.Logf("cut %d: deliveries swallowed for 100ms, then the connection down for %s", i+1, time.Since(cutAt).Round(time.Millisecond))
		// The callers whose jobs were swallowed wait for them; fresh
		// callers keep the key busy, so later jobs of the key run before
		// the lost ones come back after AckWait.
		keyLoad(h, key, 4, 10, nil)
	}
	// Keep the key busy past AckWait, so every lost delivery comes back
	// behind later jobs, then stop.
	waitFor(t, faultAckWait+time.Second)
	close(stop)
	<-loadDone

	final := settle(t, c, h, []string{key}, 30*time.Second)
	if got := holderLog(c); got != "" {
		t.Logf("lease holders: %s", got)
	}
	checkCluster(t, c, h, final, historyRules{strictOverlap: true})
}

// waitOps waits until h has recorded at least n ops.
func waitOps(t *testing.T, h *history, n int, timeout time.Duration) {
	t.Helper()
	testwait.Until(t, timeout, fmt.Sprintf("%d ops returned", n), func() (int, bool) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.ops), len(h.ops) >= n
	})
}

// waitFor lets d pass: a fault's duration, which is the point, not a wait
// for a condition.
func waitFor(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// holderLog summarizes the lease changes seen, to tell whether a fault
// made a worker lose its partition.
func holderLog(c *cluster) string {
	c.leases.mu.Lock()
	defer c.leases.mu.Unlock()
	n := 0
	for _, e := range c.leases.events {
		if e.holder == "" {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n) + " lease deletes or expiries"
}

// logLeft logs what a jobs stream that did not empty still holds, so a
// settle that fails says why: per shard, the first messages left (their
// sequence, subject, headers and size) and, per partition, its
// consumer's delivery state. A message no consumer will deliver, one
// delivered and never acked, and one counted by mistake each look
// different here.
func logLeft(t *testing.T, c *cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range partitions {
		s, err := c.js.Stream(ctx, c.names.JobsShard(i))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			break
		}
		if err != nil {
			t.Logf("left: shard %d: %v", i, err)
			continue
		}
		st := s.CachedInfo().State
		t.Logf("left: shard %d (%s, subjects %v): %d messages, seq %d to %d, %d consumers", i, s.CachedInfo().Config.Name, s.CachedInfo().Config.Subjects, st.Msgs, st.FirstSeq, st.LastSeq, st.Consumers)
		for seq, n := st.FirstSeq, 0; st.Msgs > 0 && seq <= st.LastSeq && n < leftMsgsLogged; n++ {
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgNotFound) {
					t.Logf("left: shard %d: get from %d: %v", i, seq, err)
				}
				break
			}
			t.Logf("left: shard %d seq %d subject %q stored %s, %d header bytes, %d payload bytes, headers %v, payload %.200q",
				i, m.Sequence, m.Subject, m.Time.Format(time.RFC3339Nano), headerSize(m.Header), len(m.Data), m.Header, m.Data)
			seq = m.Sequence + 1
		}
		for p := range partitions {
			cons, err := s.Consumer(ctx, c.names.Consumer(p))
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				continue
			}
			if err != nil {
				t.Logf("left: shard %d consumer %s: %v", i, c.names.Consumer(p), err)
				continue
			}
			ci := cons.CachedInfo()
			t.Logf("left: shard %d consumer %s filters %v%v: pending %d, ack pending %d, redelivered %d, waiting %d, delivered %d/%d, ack floor %d/%d, max deliver %d, ack wait %s",
				i, ci.Name, ci.Config.FilterSubject, ci.Config.FilterSubjects, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting,
				ci.Delivered.Consumer, ci.Delivered.Stream, ci.AckFloor.Consumer, ci.AckFloor.Stream, ci.Config.MaxDeliver, ci.Config.AckWait)
		}
	}
}

// leftMsgsLogged bounds the messages logLeft logs per shard.
const leftMsgsLogged = 20

// headerSize is about what h takes on the wire.
func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}
