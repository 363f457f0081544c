package keylane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/balance"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStuckHandlerDoesNotBouncePartition: the owner of a partition loses
// its lease while a handler that ignores its context keeps running. The
// partition must settle on one other worker, the one the sticky assignment
// picks with the stuck worker barred from it, and stay there (before stuck
// marks, it bounced between the others every few TTLs and was free about a
// quarter of the time), the stuck worker must say so, and once the handler
// returns the mark must go and the partitions spread evenly again, the
// stuck worker included.
func TestStuckHandlerDoesNotBouncePartition(t *testing.T) {
	// A 2s TTL: with 1s, renewals 330ms apart lapsed now and then on a
	// machine running two -race suites at once, and a lapse is a change of
	// hands this test counts.
	e := newEnv(t, TopologyConfig{Partitions: 4, LeaseTTL: 2 * time.Second})
	n := e.topo.Partitions
	ids := []string{"wa", "wb", "wc"}

	started := make(chan struct{})
	unblock := make(chan struct{})
	stuck := HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		if strings.HasPrefix(j.Key, "stuck:") {
			close(started)
			<-unblock // ignores ctx on purpose
		}
		return nil, nil
	})
	logs := &logRecorder{}
	a := e.worker("wa", stuck, func(c *WorkerConfig) { c.Logger = logs.logger() })
	b := e.worker("wb", echo(), nil)
	c := e.worker("wc", echo(), nil)
	// Registered after the workers, so it runs before their Stop.
	var unblockOnce sync.Once
	release := func() { unblockOnce.Do(func() { close(unblock) }) }
	t.Cleanup(release)
	testwait.Eventually(t, 10*time.Second, "the partitions spread evenly", func() bool {
		return evenlySpread(owners(a, b, c), n, ids)
	})
	p := -1
	for q, o := range owners(a, b, c) {
		if o == "wa" && (p < 0 || q < p) {
			p = q
		}
	}
	if p < 0 {
		t.Fatal("wa owns no partition")
	}
	key := keyIn(p, n, "stuck:")

	lkey := e.topo.Names.LeaseKey(p)
	tl := watchHolders(t, e.topo.Leases, lkey)
	if _, err := e.client.Submit(ctx(t), key, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never started")
	}
	// The fault: wa's lease entry disappears; its renew fails and it loses
	// the lease, but its handler does not return.
	if err := e.topo.Leases.Delete(ctx(t), lkey); err != nil {
		t.Fatal(err)
	}
	ttl := e.topo.Config.LeaseTTL
	// Settled: p is held by the owner the rule gives it with wa barred
	// from it, and nothing else wants to move.
	waBarred := func(q int, m string) bool { return q == p && m == "wa" }
	var successor string
	if !within(8*ttl, func() bool {
		info, _, err := lease.Read(ctx(t), e.topo.Leases, lkey)
		if err != nil || info.Holder == "wa" || owners(b, c)[p] != info.Holder {
			return false
		}
		now := owners(a, b, c)
		current := make([]string, n)
		for q, o := range now {
			current[q] = o
		}
		successor = info.Holder
		return len(now) == n && slices.Equal(partition.Assign(n, ids, current, waBarred), current)
	}) {
		t.Fatalf("partition %d never settled on another worker within %s; timeline:\n%s", p, 8*ttl, tl.since(0))
	}
	t.Logf("partition %d settled on %s", p, successor)
	// The watch may not have delivered the successor's acquire yet (the
	// read above saw it first): count changes from the write that shows it.
	testwait.Eventually(t, 2*ttl, "the timeline shows "+successor, func() bool { return tl.last() == successor })
	settled := tl.len()
	// Watch six TTLs of renewals (one every TTL/3). Any release, expiry or
	// other holder in between is a bounce.
	testwait.Eventually(t, 12*ttl, "eighteen more lease writes", func() bool { return tl.len() >= settled+18 })
	if changes := tl.changesSince(settled); changes != 0 {
		t.Errorf("partition %d changed hands %d times within six TTLs after settling on %s; timeline:\n%s",
			p, changes, successor, tl.since(settled))
	}
	if now := owners(a, b, c); now[p] != successor {
		t.Errorf("owner of partition %d is %q, want %s", p, now[p], successor)
	}
	if s := a.Stats(); s.Stuck != 1 {
		t.Errorf("wa Stats.Stuck = %d, want 1", s.Stuck)
	}
	if !logs.has(slog.LevelWarn, p, "stuck_for") {
		t.Errorf("wa logged nothing at WARN or above naming partition %d and how long it is stuck", p)
	}

	// The handler returns: the mark goes, and the partitions spread
	// evenly among all three again.
	release()
	testwait.Eventually(t, 8*ttl, "wa's stuck mark released and the partitions spread evenly", func() bool {
		_, err := e.topo.Leases.Get(ctx(t), balance.StuckKey(p, "wa"))
		return errors.Is(err, jetstream.ErrKeyNotFound) && evenlySpread(owners(a, b, c), n, ids)
	})
}

// within polls cond until it holds or timeout passes, and reports whether
// it held.
func within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// holderTimeline records every write of one lease key as seen by a watch:
// the holder, or "" for a delete, purge or expiry.
type holderTimeline struct {
	mu      sync.Mutex
	at      []time.Time
	holders []string
}

func watchHolders(t *testing.T, kv jetstream.KeyValue, key string) *holderTimeline {
	t.Helper()
	kw, err := kv.Watch(ctx(t), key, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	tl := &holderTimeline{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			h := ""
			if e.Operation() == jetstream.KeyValuePut {
				info, err := lease.Decode(e.Value())
				if err != nil {
					h = "?"
				} else {
					h = info.Holder
				}
			}
			tl.mu.Lock()
			tl.at = append(tl.at, time.Now())
			tl.holders = append(tl.holders, h)
			tl.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = kw.Stop()
		<-done
	})
	return tl
}

// last is the holder of the latest write seen ("" if none or free).
func (tl *holderTimeline) last() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.holders) == 0 {
		return ""
	}
	return tl.holders[len(tl.holders)-1]
}

func (tl *holderTimeline) len() int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(tl.holders)
}

// changesSince counts the writes from index i on whose holder differs from
// the one before (i's own predecessor included).
func (tl *holderTimeline) changesSince(i int) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	n := 0
	for j := max(i, 1); j < len(tl.holders); j++ {
		if tl.holders[j] != tl.holders[j-1] {
			n++
		}
	}
	return n
}

func (tl *holderTimeline) since(i int) string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var sb strings.Builder
	for j := max(i-1, 0); j < len(tl.holders); j++ {
		h := tl.holders[j]
		if h == "" {
			h = "(free)"
		}
		fmt.Fprintf(&sb, "  %s %s\n", tl.at[j].Format("15:04:05.000"), h)
	}
	return sb.String()
}

// logRecorder keeps a worker's log records (and prints them with -v).
type logRecorder struct {
	mu   sync.Mutex
	recs []loggedRecord
}

type loggedRecord struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

func (r *logRecorder) logger() *slog.Logger {
	var next slog.Handler
	if testing.Verbose() {
		next = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	return slog.New(&recordingHandler{r: r, next: next})
}

// has reports whether a record at level or above names partition p and
// carries attr.
func (r *logRecorder) has(level slog.Level, p int, attr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		pv, ok := rec.attrs["partition"]
		_, has := rec.attrs[attr]
		if rec.level >= level && ok && pv.String() == fmt.Sprint(p) && has {
			return true
		}
	}
	return false
}

// received reports whether the worker logged job id as received (queued
// in its key's lane; internal/tenure's joblog.go, at DEBUG).
func (r *logRecorder) received(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if v, ok := rec.attrs["job_id"]; ok && rec.msg == "job received" && v.String() == id {
			return true
		}
	}
	return false
}

func (r *logRecorder) count(level slog.Level, msgPart string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.level >= level && strings.Contains(rec.msg, msgPart) {
			n++
		}
	}
	return n
}

type recordingHandler struct {
	r     *logRecorder
	attrs []slog.Attr
	next  slog.Handler
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordingHandler) Handle(ctx context.Context, rec slog.Record) error {
	lr := loggedRecord{level: rec.Level, msg: rec.Message, attrs: map[string]slog.Value{}}
	for _, a := range h.attrs {
		lr.attrs[a.Key] = a.Value.Resolve()
	}
	rec.Attrs(func(a slog.Attr) bool {
		lr.attrs[a.Key] = a.Value.Resolve()
		return true
	})
	h.r.mu.Lock()
	h.r.recs = append(h.r.recs, lr)
	h.r.mu.Unlock()
	if h.next != nil {
		return h.next.Handle(ctx, rec)
	}
	return nil
}

func (h *recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	if h.next != nil {
		c.next = h.next.WithAttrs(as)
	}
	return &c
}

func (h *recordingHandler) WithGroup(name string) slog.Handler {
	c := *h
	if h.next != nil {
		c.next = h.next.WithGroup(name)
	}
	return &c
}

// TestClosedWatcherIsRecreated deletes the members bucket under a running
// worker and creates it again once nats.go has given up the worker's watch
// of it (its ordered consumer cannot be re-created without the stream, so
// the watch's channel closes). The worker must watch again and keep
// balancing: a worker that joins afterwards gets its partitions. Before,
// the view froze and the newcomer got nothing.
func TestClosedWatcherIsRecreated(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 6})
	logs := &logRecorder{}
	// nats.go reports giving an ordered consumer up to the connection's
	// error handler, then closes the watch.
	gaveUp := make(chan struct{}, 1)
	members := e.topo.Names.Members()
	nc, err := nats.Connect(e.srv.ClientURL(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		// Only the members bucket's stream goes missing.
		if strings.Contains(err.Error(), "stream not found: recreating ordered consumer") {
			select {
			case gaveUp <- struct{}{}:
			default:
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a, err := NewWorker(nc, WorkerConfig{Topology: e.topo.Config, Handler: echo(), ID: "wa", AckWait: 5 * time.Second, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Stop(sctx)
	})
	e.waitOwned(a)

	// The fault: the bucket's stream is gone long enough for nats.go to
	// give the watch up (it notices after two missed 5s heartbeats).
	if err := e.js.DeleteKeyValue(ctx(t), members); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gaveUp:
	case <-time.After(30 * time.Second):
		t.Fatal("nats.go did not give up wa's members watch within 30s")
	}
	if _, err := Setup(ctx(t), e.js, e.topo.Config); err != nil {
		t.Fatal(err)
	}

	b := e.worker("wb", echo(), nil)
	// wa owned all six: it keeps the three it scores highest and hands wb
	// the rest.
	all := make([]string, e.topo.Partitions)
	for p := range all {
		all[p] = "wa"
	}
	want := map[int]string{}
	for p, o := range partition.Assign(e.topo.Partitions, []string{"wa", "wb"}, all, nil) {
		want[p] = o
	}
	testwait.Eventually(t, 20*time.Second, "wa hands wb half its partitions", func() bool {
		return mapsEqual(owners(a, b), want)
	})
	if n := logs.count(slog.LevelWarn, "watch closed"); n != 1 {
		t.Errorf("wa logged %d closed watches at WARN, want 1", n)
	}
}
