package keylane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/wire"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// keptGroup is a test's setup for one group of jobs with a caller's ID:
// a reducer that records what it applied and holds the key on a gate job
// until the group is queued behind it.
type keptGroup struct {
	t       *testing.T
	gate    chan struct{} // closed: the gate job returns
	entered chan struct{} // closed by the gate job once it runs

	mu      sync.Mutex
	applied []string
}

func newKeptGroup(t *testing.T) *keptGroup {
	return &keptGroup{t: t, gate: make(chan struct{}), entered: make(chan struct{})}
}

func (g *keptGroup) reduce(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
	if string(job.Payload) == "gate" {
		g.mu.Lock()
		gate := g.gate
		close(g.entered)
		g.mu.Unlock()
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if cur == nil {
			cur = []byte("0")
		}
		return cur, nil, nil
	}
	g.mu.Lock()
	g.applied = append(g.applied, job.ID)
	g.mu.Unlock()
	next, _, err := countReducer(ctx, job, cur)
	return next, []byte("ran " + job.ID), err
}

// again readies g for another group: a new gate, nothing applied.
func (g *keptGroup) again() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate, g.entered, g.applied = make(chan struct{}), make(chan struct{}), nil
}

func (g *keptGroup) appliedIDs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.applied)
}

// ownerHolds is how many jobs partition p's owner on w holds (running or
// queued in its lanes).
func ownerHolds(w *Worker, p int) int {
	o := ownerOf(w, p)
	if o == nil {
		return 0
	}
	held, _ := o.InFlight()
	return held
}

// lookUps counts, from its own connection, the look-up requests on a
// results bucket: batched (a direct get with multi_last on the stream's
// subject) and per ID (a leader get by key, or a direct get by key); a
// leader get of the stream's newest message (a tenure's first mark) is
// neither.
type lookUps struct {
	t              *testing.T
	nc             *nats.Conn
	stream, leader string
	ch             chan *nats.Msg
	batched, perID int
}

func countLookUps(t *testing.T, nc *nats.Conn, results string) *lookUps {
	t.Helper()
	c := &lookUps{t: t, nc: nc, stream: "$JS.API.DIRECT.GET.KV_" + results, leader: "$JS.API.STREAM.MSG.GET.KV_" + results, ch: make(chan *nats.Msg, 1<<16)}
	for _, subject := range []string{"$JS.API.DIRECT.GET.>", "$JS.API.STREAM.MSG.GET.>"} {
		sub, err := nc.ChanSubscribe(subject, c.ch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

// counts returns the requests seen so far. The flush makes sure every
// request the server routed before it is in the channel.
func (c *lookUps) counts() (batched, perID int) {
	c.t.Helper()
	if err := c.nc.Flush(); err != nil {
		c.t.Fatal(err)
	}
	for {
		select {
		case m := <-c.ch:
			switch {
			case m.Subject == c.stream && bytes.Contains(m.Data, []byte(`"multi_last"`)):
				c.batched++
			case bytes.Contains(m.Data, []byte(wire.BatchOutcomesPrefix)) || strings.Contains(m.Subject, "."+wire.BatchOutcomesPrefix):
				// A batch entry's read (its ID bound to its message, once
				// per batch message: every job travels in one), no job's
				// look-up by ID.
			case strings.HasPrefix(m.Subject, c.stream+"."):
				c.perID++
			case m.Subject == c.leader && !bytes.Contains(m.Data, []byte(`>"`)) && !bytes.Contains(m.Data, []byte(`\u003e"`)):
				c.perID++
			}
		default:
			return c.batched, c.perID
		}
	}
}

// run submits a gate job then, with a caller's ID each, jobs ids to key
// of partition 0, waits until w holds all of them, opens the gate and
// waits until every one was settled.
func (g *keptGroup) run(e *env, w *Worker, c *Client, key string, ids []string) {
	g.t.Helper()
	if _, err := c.Submit(ctx(g.t), key, []byte("gate")); err != nil {
		g.t.Fatal(err)
	}
	// The group is submitted once the gate runs alone, so it is taken
	// as one group when the gate opens.
	g.mu.Lock()
	entered := g.entered
	g.mu.Unlock()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		g.t.Fatal("the gate job never ran")
	}
	for _, id := range ids {
		if _, err := c.Submit(ctx(g.t), key, nil, WithID(id)); err != nil {
			g.t.Fatal(err)
		}
	}
	testwait.Eventually(g.t, 10*time.Second, "the group queued behind the gate", func() bool { return ownerHolds(w, 0) == len(ids)+1 })
	g.mu.Lock()
	close(g.gate)
	g.mu.Unlock()
	waitEmpty(e)
}

// keepEarlier stores outcomes as an earlier run would have kept them, and
// one kept outcome deleted since (not kept any more).
func keepEarlier(t *testing.T, kv jetstream.KeyValue, kept map[string][]byte, deleted string) {
	t.Helper()
	for id, v := range kept {
		if _, err := kv.Put(ctx(t), id, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx(t), deleted, encodeResult([]byte("old"), nil, false)); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx(t), deleted); err != nil {
		t.Fatal(err)
	}
}

// checkKeptGroup checks that the jobs with a kept outcome were answered
// with it and not run, and the others ran once each, in order.
func checkKeptGroup(t *testing.T, g *keptGroup, c *Client, state *State, key string, ids []string, kept map[string][]byte) {
	t.Helper()
	var want []string
	for _, id := range ids {
		if kept[id] == nil {
			want = append(want, id)
		}
	}
	if got := g.appliedIDs(); !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v: a kept job ran again, or one without was not run once in order", got, want)
	}
	for _, id := range ids {
		res, err := c.Result(ctx(t), id)
		var re *RemoteError
		switch v := kept[id]; {
		case v == nil:
			if err != nil || string(res) != "ran "+id {
				t.Fatalf("result of %s = %q, %v; want its own run", id, res, err)
			}
		case v[0] == resultOK:
			if err != nil || !bytes.Equal(res, v[1:]) {
				t.Fatalf("result of %s = %q, %v; want the kept %q", id, res, err, v[1:])
			}
		default:
			if !errors.As(err, &re) || re.Message != string(v[1:]) {
				t.Fatalf("result of %s = %q, %v; want the kept error %q", id, res, err, v[1:])
			}
		}
	}
	if got, _ := state.Get(ctx(t), key); string(got.Value) != fmt.Sprint(len(want)) {
		t.Fatalf("count %q, want %d", got.Value, len(want))
	}
}

func keptIDs(prefix string, n int) ([]string, map[string][]byte, string) {
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("%s-%d", prefix, i))
	}
	kept := map[string][]byte{
		ids[0]:   encodeResult([]byte("earlier 0"), nil, false),
		ids[7]:   encodeResult([]byte("earlier 7"), nil, false),
		ids[8]:   encodeResult(nil, Permanent(errors.New("sold out")), false),
		ids[20]:  encodeResult([]byte("earlier 20"), nil, false),
		ids[n-1]: encodeResult([]byte("earlier last"), nil, false),
	}
	return ids, kept, ids[13]
}

// TestGroupLooksUpKeptOutcomesAtOnce: a group of jobs with a caller's ID,
// some of whose IDs have kept outcomes (and one a deleted one), is looked
// up with one request: the kept ones are answered without running, the
// others run once, in order.
// Without the batched look-up the request count is 0 batched and one per
// ID; with a batch whose "none" were not definite the kept ones would run.
func TestGroupLooksUpKeptOutcomesAtOnce(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	g := newKeptGroup(t)
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, ReducerFunc(g.reduce) })
	e.waitOwned(w)
	ids, kept, deleted := keptIDs("pay", 40)
	keepEarlier(t, e.topo.Results, kept, deleted)
	n := countLookUps(t, natstest.Connect(t, e.srv), e.topo.Names.Results())

	g.run(e, w, e.client, "k", ids)
	if b, p := n.counts(); b != 1 || p != 0 {
		t.Fatalf("%d batched and %d per-ID look-ups for one group of %d jobs; want 1 and 0", b, p, len(ids))
	}
	checkKeptGroup(t, g, e.client, NewState(e.topo.State), "k", ids, kept)
	if s := w.Stats(); s.FromResults != int64(len(kept)) {
		t.Fatalf("%d jobs answered from kept outcomes, want %d", s.FromResults, len(kept))
	}

	// A group none of whose IDs has a kept outcome: the server's 404 No
	// Results settles all of them, with one request too.
	g.again()
	var fresh []string
	for i := range 30 {
		fresh = append(fresh, fmt.Sprintf("new-%d", i))
	}
	_, before := n.counts() // Result's look-ups above
	g.run(e, w, e.client, "k2", fresh)
	if b, p := n.counts(); b != 2 || p != before {
		p -= before
		t.Fatalf("%d batched and %d per-ID look-ups after a second group; want 2 and 0", b, p)
	}
	checkKeptGroup(t, g, e.client, NewState(e.topo.State), "k2", fresh, nil)
}

// TestKeptLookUpFallsBackWhenBatchRefused: a worker user that may get
// results by key but not publish the batched request on the stream's
// subject still finds every kept outcome (one ID at a time), never runs a
// finished job again, and stops asking for the batch after the first
// refusal. Without the fallback the refused IDs would count as not kept
// and run again.
func TestKeptLookUpFallsBackWhenBatchRefused(t *testing.T) {
	const ns = "kg"
	srv := natstest.StartConfig(t, `authorization {
  users = [
    { user: worker, password: w, permissions: { publish: { allow: [">"], deny: ["$JS.API.DIRECT.GET.KV_KG_RESULTS"] } } }
    { user: other, password: o }
  ]
}
`)
	cnc := natstest.Connect(t, srv, nats.UserInfo("other", "o"))
	e := newEnvOn(t, srv, cnc, TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: time.Second})
	c := e.client
	g := newKeptGroup(t)
	wnc := natstest.Connect(t, srv, nats.UserInfo("worker", "w"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	w := startWorker(t, wnc, WorkerConfig{Topology: e.topo.Config, Reducer: ReducerFunc(g.reduce), ID: "w", AckWait: 5 * time.Second, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	e.waitOwned(w)
	ids, kept, deleted := keptIDs("order", 30)
	keepEarlier(t, e.topo.Results, kept, deleted)
	n := countLookUps(t, natstest.Connect(t, srv, nats.UserInfo("other", "o")), e.topo.Names.Results())

	g.run(e, w, c, "k", ids)
	// Every explicit ID was looked up by key.
	if b, p := n.counts(); b != 0 || p != len(ids) {
		t.Fatalf("%d batched and %d per-ID look-ups seen for %d jobs whose batch was refused; want 0 and %d", b, p, len(ids), len(ids))
	}
	checkKeptGroup(t, g, e.client, NewState(e.topo.State), "k", ids, kept)
	off, probed := w.kept.LookUpsOff()
	if off == 0 || probed {
		t.Fatalf("batched look-up off until %d, probed %v: the refusal was not remembered", off, probed)
	}
	// A second group pays no refused request: the worker remembered.
	g.again()
	ids2, kept2, deleted2 := keptIDs("again", 25)
	keepEarlier(t, e.topo.Results, kept2, deleted2)
	g.run(e, w, c, "k2", ids2)
	checkKeptGroup(t, g, e.client, NewState(e.topo.State), "k2", ids2, kept2)
	if got, _ := w.kept.LookUpsOff(); got != off {
		t.Fatal("the second group asked for the refused batch again")
	}
}

// TestSetupAllowsDirectGetsOnResults: a results bucket whose stream does
// not answer direct gets (made by something other than keylane) is
// upgraded in place by Setup, keeping what it holds, so the batched
// look-up is answered. Without the upgrade the stream stays without it.
func TestSetupAllowsDirectGetsOnResults(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	name := "KV_" + e.topo.Names.Results()
	s, err := e.js.Stream(ctx(t), name)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.AllowDirect = false
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	if _, err := e.topo.Results.Put(ctx(t), "kept", encodeResult([]byte("v"), nil, false)); err != nil {
		t.Fatal(err)
	}
	topo, err := Setup(ctx(t), e.js, e.topo.Config)
	if err != nil {
		t.Fatal(err)
	}
	s, err = e.js.Stream(ctx(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if !s.CachedInfo().Config.AllowDirect {
		t.Fatal("the results stream still refuses direct gets after Setup")
	}
	if en, err := topo.Results.Get(ctx(t), "kept"); err != nil || string(en.Value()[1:]) != "v" {
		t.Fatalf("kept outcome after the upgrade: %v", err)
	}
	m, err := e.nc.Request("$JS.API.DIRECT.GET."+name, []byte(`{"multi_last":["$KV.`+e.topo.Names.Results()+`.kept"],"batch":1}`), 5*time.Second)
	if err != nil || m.Header.Get("Nats-Subject") != "$KV."+e.topo.Names.Results()+".kept" {
		t.Fatalf("batched direct get after the upgrade = %v, %v", m, err)
	}
}

// TestKeptLookUpTraffic measures what the batched look-up saves on the
// worker's connection for a group of jobs with a caller's ID none of
// which is kept (a shop's purchases), against the per-ID look-up of the
// same group size: messages and bytes both ways, and the whole process's
// allocations (server, client and worker together, so only a rough
// figure). Run with -v for the figures.
func TestKeptLookUpTraffic(t *testing.T) {
	const jobs = 200
	e := newEnv(t, TopologyConfig{Partitions: 1})
	g := newKeptGroup(t)
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, ReducerFunc(g.reduce) })
	e.waitOwned(w)
	type traffic struct{ out, in, outBytes, inBytes, mallocs uint64 }
	measure := func(name string) traffic {
		g.again()
		ids := make([]string, jobs)
		for i := range ids {
			ids[i] = fmt.Sprintf("%s-%d", name, i)
		}
		var m0, m1 runtime.MemStats
		s0 := w.nc.Stats()
		runtime.ReadMemStats(&m0)
		g.run(e, w, e.client, name, ids)
		runtime.ReadMemStats(&m1)
		s1 := w.nc.Stats()
		if got := g.appliedIDs(); len(got) != jobs {
			t.Fatalf("%s: %d jobs applied, want %d", name, len(got), jobs)
		}
		return traffic{s1.OutMsgs - s0.OutMsgs, s1.InMsgs - s0.InMsgs, s1.OutBytes - s0.OutBytes, s1.InBytes - s0.InBytes, m1.Mallocs - m0.Mallocs}
	}
	measure("warm") // the probe's flush, the first group's setup
	n := countLookUps(t, natstest.Connect(t, e.srv), e.topo.Names.Results())
	batched := measure("batched")
	b1, p1 := n.counts()
	w.kept.PauseLookUps(time.Now().Add(time.Hour))
	perID := measure("perid")
	b2, p2 := n.counts()
	per := func(a, b uint64) float64 { return (float64(b) - float64(a)) / jobs }
	t.Logf("per job, per-ID minus batched look-up: %.2f messages out, %.2f in, %.1f payload bytes out, %.1f in (headers and data, as nats.go counts them: not the subjects), %.0f allocations (whole process)",
		per(batched.out, perID.out), per(batched.in, perID.in), per(batched.outBytes, perID.outBytes), per(batched.inBytes, perID.inBytes), per(batched.mallocs, perID.mallocs))
	t.Logf("batched %+v, per-ID %+v (worker connection, %d jobs)", batched, perID, jobs)
	// The rest of the traffic varies between runs, more on a loaded
	// machine (group commits cut by time make more or fewer state
	// writes: a loaded run once saved 148 messages of 200 that way), so
	// the saving is checked on the look-ups themselves: a few batched
	// requests for the group, then one per-ID request per job.
	t.Logf("look-ups: batched run %d batched and %d per-ID requests; per-ID run %d and %d", b1, p1, b2-b1, p2-p1)
	if b1 == 0 || b1 > jobs/10 || p1 > jobs/10 || b2 != b1 || p2-p1 < jobs {
		t.Fatalf("look-ups: batched run %d batched and %d per-ID requests, per-ID run %d and %d; want a few batched requests for %d jobs, then one per-ID request per job", b1, p1, b2-b1, p2-p1, jobs)
	}
}

// TestLoneJobLooksUpWithOneGet: a job with a caller's ID alone in its
// group (the common case with many keys) is looked up with one plain
// get (the leader's: storedResult), not the batched form and its inbox
// subscription.
func TestLoneJobLooksUpWithOneGet(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	e.waitOwned(e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer }))
	n := countLookUps(t, natstest.Connect(t, e.srv), e.topo.Names.Results())
	if _, err := e.client.Call(ctx(t), "k", []byte("inc"), WithID("lone")); err != nil {
		t.Fatal(err)
	}
	if batched, perID := n.counts(); batched != 0 || perID != 1 {
		t.Fatalf("%d batched and %d per-ID look-ups for one job; want 0 and 1", batched, perID)
	}
}

// TestBatchedMissFromALaggingReplicaGoesToTheLeader: a batched direct get
// answered by a replica that has not applied this tenure's newest kept
// outcome (its EOB's Nats-UpTo-Sequence below the owner's mark) settles
// only its hits; every ID it says is not kept is looked up again with a
// leader get, and nothing kept runs. The lagging replica is simulated by
// a mark past the stream's end, as if this tenure had kept an outcome the
// answering replica has not applied. Before marks, those misses were
// settled by the batched answer (0 leader gets).
func TestBatchedMissFromALaggingReplicaGoesToTheLeader(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	g := newKeptGroup(t)
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, ReducerFunc(g.reduce) })
	e.waitOwned(w)
	ids, kept, deleted := keptIDs("lag", 30)
	keepEarlier(t, e.topo.Results, kept, deleted)
	markAhead(t, e, w, ids[0])
	n := countLookUps(t, natstest.Connect(t, e.srv), e.topo.Names.Results())

	g.run(e, w, e.client, "k", ids)
	misses := len(ids) - len(kept)
	if b, p := n.counts(); b != 1 || p != misses {
		t.Fatalf("%d batched and %d per-ID look-ups for a group of %d (%d kept) answered by a replica behind the mark; want 1 and %d", b, p, len(ids), len(kept), misses)
	}
	checkKeptGroup(t, g, e.client, NewState(e.topo.State), "k", ids, kept)
}

// TestBatchedDeadHitFromALaggingReplicaGoesToTheLeader: a kept outcome
// can change once: a redrive overwrites the dead-lettered job's outcome
// with the redriven job's. A replica behind the tenure's mark may still
// hold the dead one, so a dead outcome from it is confirmed with the
// leader (it was trusted as it came, and a retry by ID after a redrive
// could be told "failed" for work that was applied); other hits are
// final as they come.
func TestBatchedDeadHitFromALaggingReplicaGoesToTheLeader(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	g := newKeptGroup(t)
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, ReducerFunc(g.reduce) })
	e.waitOwned(w)
	ids, kept, deleted := keptIDs("deadlag", 30)
	dead := []string{ids[3], ids[11]}
	for _, id := range dead {
		kept[id] = encodeResult(nil, Permanent(errors.New("card declined")), true)
	}
	keepEarlier(t, e.topo.Results, kept, deleted)
	markAhead(t, e, w, ids[0])
	n := countLookUps(t, natstest.Connect(t, e.srv), e.topo.Names.Results())

	g.run(e, w, e.client, "k", ids)
	want := len(ids) - len(kept) + len(dead)
	if b, p := n.counts(); b != 1 || p != want {
		t.Fatalf("%d batched and %d per-ID look-ups for a group of %d (%d kept, %d of them dead) answered by a replica behind the mark; want 1 and %d", b, p, len(ids), len(kept), len(dead), want)
	}
	checkKeptGroup(t, g, e.client, NewState(e.topo.State), "k", ids, kept)
}

// markAhead makes partition 0's owner of w take every replica as behind:
// its mark names an existing subject (so a batched answer ends with an
// EOB) at a sequence no replica has yet.
func markAhead(t *testing.T, e *env, w *Worker, id string) {
	t.Helper()
	o := ownerOf(w, 0)
	if o == nil {
		t.Fatal("no owner of partition 0")
	}
	info, err := e.js.Stream(ctx(t), "KV_"+e.topo.Names.Results())
	if err != nil {
		t.Fatal(err)
	}
	o.NoteKept("$KV."+e.topo.Names.Results()+"."+id, info.CachedInfo().State.LastSeq+1000)
}
