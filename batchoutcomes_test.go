package keylane

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
)

// tagger is a counter whose result names the job's payload, so a Call can
// tell its own job's outcome from another's: "<payload>@n=<count>".
type tagger struct{ *counter }

func (g tagger) Reduce(ctx context.Context, j Job, cur []byte) ([]byte, []byte, error) {
	state, res, err := g.counter.Reduce(ctx, j, cur)
	return state, append([]byte(string(j.Payload)+"@"), res...), err
}

// resultsKeys returns the keys of the results bucket, "batch/..." ones
// apart, and the batch entries' decoded outcomes by batch ID.
func (e *env) resultsKeys() (perID []string, batches map[string][]wire.BatchOutcome) {
	e.t.Helper()
	lister, err := e.topo.Results.ListKeys(ctx(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	batches = map[string][]wire.BatchOutcome{}
	for k := range lister.Keys() {
		if !strings.HasPrefix(k, wire.BatchOutcomesPrefix) {
			perID = append(perID, k)
			continue
		}
		entry, err := e.topo.Results.Get(ctx(e.t), k)
		if err != nil {
			e.t.Fatal(err)
		}
		id, outs, err := wire.DecodeBatchOutcomes(entry.Value())
		if err != nil || wire.BatchOutcomesKey(id) != k {
			e.t.Fatalf("entry %s: batch %q, %v", k, id, err)
		}
		batches[id] = outs
	}
	return perID, batches
}

// checkOwnResults checks that every Call of payloads got its own job's
// outcome (tagger's), lead included.
func checkOwnResults(t *testing.T, done chan callOutcome, payloads []string) {
	t.Helper()
	for range len(payloads) + 1 {
		select {
		case o := <-done:
			if o.err != nil {
				t.Fatalf("call %s: %v", o.payload, o.err)
			}
			if !strings.HasPrefix(o.res, o.payload+"@n=") {
				t.Fatalf("call %s got %q: not its own job's outcome", o.payload, o.res)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a Call never recovered the reply it lost")
		}
	}
}

// TestBatchedCallRecoversALostReplyFromItsBatchEntry: a batch of Calls on
// a Reducer's namespace whose replies are lost (the callers' connection
// cut while the batch runs): every Call gets its own result once back,
// from the one entry the worker kept for the batch, and no outcome is
// kept per job ID (the lead's neither: it went alone, a batch of one,
// and its outcome is in its own batch's entry). Before outcomes were
// kept per batch there was no batch entry (one entry per job ID
// instead).
func TestBatchedCallRecoversALostReplyFromItsBatchEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	r := tagger{newCounter()}
	gated := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
		if string(job.Payload) != "lead" {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
		return r.Reduce(ctx, job, cur)
	})
	w := batchWorker(e, "w", gated)
	e.waitOwned(w)
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	payloads := []string{"a", "b", "c", "d"}
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker never ran the batch")
	}
	p.Cut()
	close(release)
	testwait.Eventually(t, 10*time.Second, "every job finished and answered into the void", func() bool {
		return w.Stats().Succeeded == int64(len(payloads)+1)
	})
	testwait.Eventually(t, 10*time.Second, "the batch acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	perID, batches := e.resultsKeys()
	if len(perID) != 0 {
		t.Fatalf("outcomes kept by ID %v (batch entries %v), want none", perID, batches)
	}
	lead, _, _ := leadAndQueued(t, batches, len(payloads))
	if res, _, _ := decodeResult(lead.Value); !strings.HasPrefix(string(res), "lead@") {
		t.Fatalf("the batch of one keeps %q, not the lead's outcome", res)
	}
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	checkOwnResults(t, done, payloads)
}

// gateLast is a tagger that, once, holds the runner after the job that
// brings its applied count to n was committed (every state write done),
// before anything of its group is kept, answered or acked.
type gateLast struct {
	tagger
	n       int
	once    sync.Once
	hit     chan struct{}
	release chan struct{}
}

func (g *gateLast) Committed(j Job, applied bool) {
	g.counter.Committed(j, applied)
	g.counter.mu.Lock()
	total := 0
	for _, k := range g.counter.applied {
		total += k
	}
	g.counter.mu.Unlock()
	if applied && total == g.n {
		g.once.Do(func() {
			close(g.hit)
			<-g.release
		})
	}
}

// TestBatchRedeliveredBeforeItsOutcomesWereKept: the worker writes every
// state of a batch of Calls, then its connection is cut before the
// batch's outcomes entry is written (and before any reply or ack); the
// callers' connection is cut too. The next owner gets the batch again,
// answers every job from its held outcome (nothing applied twice),
// writes the batch's entry and acks; every Call, back, gets its own
// result from that entry. (The lead, a batch of one ahead of it, may
// have been settled and its entry written before the cut.)
func TestBatchRedeliveredBeforeItsOutcomesWereKept(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	payloads := []string{"a", "b", "c", "d"}
	g := &gateLast{tagger: tagger{newCounter()}, n: len(payloads) + 1, hit: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	w1 := batchWorker(e, "w1", g)
	t.Cleanup(release) // after w1's own: its Stop waits on a gated Committed
	e.waitOwned(w1)
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	select {
	case <-g.hit:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker never applied the batch")
	}
	p.Cut()
	w1.nc.Close() // the crash: nothing more of w1 reaches the server
	release()
	_, before := e.resultsKeys()
	for _, outs := range before {
		if len(outs) != 1 {
			t.Fatalf("batch entries %v written before the crash, not only the lead's batch of one", before)
		}
	}
	w2 := batchWorker(e, "w2", g.tagger)
	testwait.Eventually(t, 20*time.Second, "the redelivered batch acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	_, batches := e.resultsKeys()
	leadAndQueued(t, batches, len(payloads)) // the queued batch's: the next owner's
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	checkOwnResults(t, done, payloads)
	g.counter.mu.Lock()
	applied := copyCounts(g.counter.applied)
	g.counter.mu.Unlock()
	if len(applied) != len(payloads)+1 {
		t.Fatalf("applied %v, want %d jobs", applied, len(payloads)+1)
	}
	for id, n := range applied {
		if n != 1 {
			t.Fatalf("job %s applied %d times", id, n)
		}
	}
	if s := e.stateOf("seat:a"); s != strconv.Itoa(len(payloads)+1) {
		t.Fatalf("state %q, want %d", s, len(payloads)+1)
	}
	if s := w2.Stats(); s.DeadLettered != 0 {
		t.Fatalf("the next owner dead-lettered %d jobs", s.DeadLettered)
	}
}

// TestBatchEntryNeverAnswersAnotherJob: a batch entry that is not the
// one asked for (garbled, another batch's) is a clear error for the Call
// recovering its outcome there, never another job's outcome.
func TestBatchEntryNeverAnswersAnotherJob(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	c := e.client
	put := func(batchID string, v []byte) {
		if _, err := e.topo.Results.Put(ctx(t), wire.BatchOutcomesKey(batchID), v); err != nil {
			t.Fatal(err)
		}
	}
	other, err := wire.EncodeBatchOutcomes("B2aaaaaaaaaaaaaaaaaaaa", []wire.BatchOutcome{{Index: 1, ID: "B2aaaaaaaaaaaaaaaaaaaa.1", Value: encodeResult([]byte("not yours"), nil, false)}})
	if err != nil {
		t.Fatal(err)
	}
	put("B1aaaaaaaaaaaaaaaaaaaa", other) // another batch's entry under B1aaaaaaaaaaaaaaaaaaaa's key
	put("B3aaaaaaaaaaaaaaaaaaaa", other[:len(other)-2])
	mine, _ := wire.EncodeBatchOutcomes("B4aaaaaaaaaaaaaaaaaaaa", []wire.BatchOutcome{{Index: 1, ID: "B4aaaaaaaaaaaaaaaaaaaa.1", Value: encodeResult([]byte("b4.1's"), nil, false)}})
	put("B4aaaaaaaaaaaaaaaaaaaa", mine)
	for _, id := range []string{"B1aaaaaaaaaaaaaaaaaaaa.1", "B3aaaaaaaaaaaaaaaaaaaa.1"} {
		cctx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
		res, err := c.e.AwaitOutcome(cctx, id)
		cancel()
		if !errors.Is(err, wire.ErrBadOutcomes) {
			t.Fatalf("outcome of %s = %q, %v; want wire.ErrBadOutcomes", id, res, err)
		}
	}
	res, err := c.e.AwaitOutcome(ctx(t), "B4aaaaaaaaaaaaaaaaaaaa.1")
	if err != nil || string(res) != "b4.1's" {
		t.Fatalf("outcome of B4aaaaaaaaaaaaaaaaaaaa.1 = %q, %v", res, err)
	}
}

// TestRetriedBatchedCallIsAnsweredFromItsBatchEntry: a batched Call's job
// ID names its batch and index; called again WithID that ID after the
// key's held window moved past it (more than HeldJobs later jobs), the job
// is answered from its batch's entry with its first outcome, not applied
// again (promise 7). Without the look-up in the batch entry it was
// applied a second time.
func TestRetriedBatchedCallIsAnsweredFromItsBatchEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := tagger{newCounter()}
	w := batchWorker(e, "w", r)
	e.waitOwned(w)
	first, want, c := batchPastItsHeldWindow(t, e)
	kept, _, _ := decodeResult(first.Value)
	if res, err := c.Result(ctx(t), first.ID); err != nil || string(res) != string(kept) {
		t.Fatalf("Result(%s) = %q, %v; want %q", first.ID, res, err, kept)
	}
	res, err := c.Call(ctx(t), "seat:a", []byte("again"), WithID(first.ID))
	if err != nil || string(res) != string(kept) {
		t.Fatalf("retried call %s = %q, %v; want its first outcome %q", first.ID, res, err, kept)
	}
	r.mu.Lock()
	n := r.applied[first.ID]
	r.mu.Unlock()
	if n != 1 {
		t.Fatalf("job %s applied %d times", first.ID, n)
	}
	if s := e.stateOf("seat:a"); s != want {
		t.Fatalf("state %q after the retry, want %q", s, want)
	}
}

// bigResults is a Reducer that counts and answers each job with a result
// of size bytes.
type bigResults struct{ size int }

func (b bigResults) Reduce(_ context.Context, _ Job, cur []byte) ([]byte, []byte, error) {
	n, _ := strconv.Atoi(string(cur))
	return []byte(strconv.Itoa(n + 1)), bytes.Repeat([]byte("r"), b.size), nil
}

// TestBatchEntryOverMaxPayloadIsKeptByID: a batch of Calls whose outcomes
// together pass the server's max_payload (64 KiB here) cannot be one
// results entry. Refused for good, it must not be retried: the outcomes
// are kept one entry per job ID, and the batch is acked. Before, the
// worker published the entry again with backoff for as long as its lease
// held, the batch never acked (the jobs stream never emptied).
func TestBatchEntryOverMaxPayloadIsKeptByID(t *testing.T) {
	const maxPayload = 64 << 10
	srv := natstest.StartConfig(t, "max_payload: "+strconv.Itoa(maxPayload)+"\n")
	e := newEnvOn(t, srv, natstest.Connect(t, srv), TopologyConfig{Partitions: 1})
	batchWorker(e, "w", bigResults{size: 4 << 10})
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	const calls = 64
	var wg sync.WaitGroup
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Call(ctx(t), "seat:big", []byte("x"))
			if err != nil || len(res) != 4<<10 {
				t.Errorf("Call: %d bytes, %v", len(res), err)
			}
		}()
	}
	wg.Wait()
	testwait.Eventually(t, 20*time.Second, "every batch acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	if n, _, _ := batches.Pending(); n == 0 {
		t.Fatal("no batch message travelled: the test proved nothing")
	}
	if got := e.stateOf("seat:big"); got != strconv.Itoa(calls) {
		t.Fatalf("state %q, want %d", got, calls)
	}
}

// batchPastItsHeldWindow runs a batch of Calls on seat:a through e's
// batch worker, then more than HeldJobs later jobs of the key, so nothing but
// the batch's entry answers a retry by ID of one of its Calls. It returns
// the batch's first kept outcome and the key's state after it all.
func batchPastItsHeldWindow(t *testing.T, e *env) (wire.BatchOutcome, string, *Client) {
	t.Helper()
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	payloads := []string{"a", "b", "c", "d"}
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	checkOwnResults(t, done, payloads)
	testwait.Eventually(t, 10*time.Second, "the batch acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	_, batches := e.resultsKeys()
	_, _, outs := leadAndQueued(t, batches, len(payloads))
	first := outs[0]
	reqs := make([]Request, HeldJobs+10)
	for i := range reqs {
		reqs[i] = Request{Key: "seat:a", Payload: []byte("later")}
	}
	if _, err := c.SubmitMany(ctx(t), reqs); err != nil {
		t.Fatal(err)
	}
	want := strconv.Itoa(len(payloads) + 1 + len(reqs))
	testwait.Eventually(t, 30*time.Second, "the later jobs applied", func() bool { return e.stateOf("seat:a") == want })
	return first, want, c
}

// TestGarbledBatchEntryNeverRunsTheJobAgain: a batched Call retried by
// its ID after the key's held window moved past it, whose batch's entry is
// garbled (cut short here; the results bucket is written by workers only,
// so that is never legit), is not run again: its kept outcome exists but
// cannot be read. It is dead-lettered, saying why, and its caller gets
// that. Before, the worker said it at ERROR and counted the entry as no
// outcome: the job was applied a second time and the Call succeeded.
func TestGarbledBatchEntryNeverRunsTheJobAgain(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := tagger{newCounter()}
	w := batchWorker(e, "w", r)
	e.waitOwned(w)
	first, want, c := batchPastItsHeldWindow(t, e)
	batchID, _, _ := wire.ParseBatchedJobID(first.ID)
	entry, err := e.topo.Results.Get(ctx(t), wire.BatchOutcomesKey(batchID))
	if err != nil {
		t.Fatal(err)
	}
	garbled := entry.Value()[:len(entry.Value())-1]
	if _, err := e.topo.Results.Put(ctx(t), wire.BatchOutcomesKey(batchID), garbled); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx(t), 30*time.Second)
	defer cancel()
	res, err := c.Call(cctx, "seat:a", []byte("again"), WithID(first.ID))
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered || !strings.Contains(re.Message, "unreadable") {
		t.Fatalf("retried call %s = %q, %v; want a dead letter saying its kept outcome is unreadable", first.ID, res, err)
	}
	r.mu.Lock()
	n := r.applied[first.ID]
	r.mu.Unlock()
	if n != 1 {
		t.Fatalf("job %s applied %d times", first.ID, n)
	}
	if s := e.stateOf("seat:a"); s != want {
		t.Fatalf("state %q after the retry, want %q", s, want)
	}
	if s := w.Stats(); s.DeadLettered != 1 {
		t.Fatalf("dead-lettered %d jobs, want the retried one", s.DeadLettered)
	}
}

// TestBatchEntryWithoutTheJobIsNoOutcome: a batch's entry that lacks a
// job (legit: a job of the batch whose outcome is kept by its ID, or none)
// is no outcome for it, not an error: a Call recovering its reply keeps
// waiting and gets the outcome kept by its ID once it comes, and Result
// and InspectJob say ErrNoResult until then. Before, both failed at once with
// wire.ErrBadOutcomes ("holds no outcome at index"): a Call whose reply
// was late failed though its job finished. (InspectJob failed so too.)
func TestBatchEntryWithoutTheJobIsNoOutcome(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	c := e.client
	const batchID = "B5aaaaaaaaaaaaaaaaaaaa"
	entry, err := wire.EncodeBatchOutcomes(batchID, []wire.BatchOutcome{{Index: 1, ID: wire.BatchedJobID(batchID, 1), Value: encodeResult([]byte("b5.1's"), nil, false)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.topo.Results.Put(ctx(t), wire.BatchOutcomesKey(batchID), entry); err != nil {
		t.Fatal(err)
	}
	id := wire.BatchedJobID(batchID, 2)
	if res, err := c.Result(ctx(t), id); !errors.Is(err, ErrNoResult) {
		t.Fatalf("Result(%s) = %q, %v; want ErrNoResult", id, res, err)
	}
	if f, err := InspectJob(ctx(t), e.js, e.ns, id, ""); !errors.Is(err, ErrNoResult) {
		t.Fatalf("InspectJob(%s) = %+v, %v; want ErrNoResult", id, f, err)
	}
	type got struct {
		res []byte
		err error
	}
	done := make(chan got, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx(t), 30*time.Second)
		defer cancel()
		res, err := c.e.AwaitOutcome(cctx, id)
		done <- got{res, err}
	}()
	// Two polls of the entry without the job, then its outcome by ID.
	select {
	case g := <-done:
		t.Fatalf("outcome of %s = %q, %v before it was kept", id, g.res, g.err)
	case <-time.After(2*outcomePoll + outcomePoll/2):
	}
	if _, err := e.topo.Results.Put(ctx(t), id, encodeResult([]byte("b5.2's"), nil, false)); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-done:
		if g.err != nil || string(g.res) != "b5.2's" {
			t.Fatalf("outcome of %s = %q, %v; want the one kept by its ID", id, g.res, g.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the outcome kept by ID never answered")
	}
}

// TestRedeliveredBatchReadsItsEntryOnce: a batch of Calls on a Reducer's
// namespace with StoreResults (every job looked up by ID on redelivery),
// its worker cut off after applying it and before keeping any outcome:
// the next owner looks each redelivered job up by its ID and, missing
// there, in its batch's entry, which it reads as the results stream's
// leader holds it (a direct get on one replica) once for the batch, not
// once per job. Every Call still gets its
// own result, each job applied once. Before, each job read the entry
// (4 leader gets of batch/<id> for 4 jobs). (The lead, a batch of one
// ahead of the batch, is redelivered too when its ack was lost in the
// crash, and reads its own entry once.)
func TestRedeliveredBatchReadsItsEntryOnce(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	payloads := []string{"a", "b", "c", "d"}
	g := &gateLast{tagger: tagger{newCounter()}, n: len(payloads) + 1, hit: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	storing := func(r Reducer) func(*WorkerConfig) {
		return func(c *WorkerConfig) { c.Handler, c.Reducer, c.StoreResults = nil, r, true }
	}
	w1 := e.worker("w1", nil, storing(g))
	t.Cleanup(release) // after w1's own: its Stop waits on a gated Committed
	e.waitOwned(w1)
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	select {
	case <-g.hit:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker never applied the batch")
	}
	p.Cut()
	w1.nc.Close() // the crash: nothing more of w1 reaches the server
	release()
	// A copy of every leader get on the results stream, and of every
	// direct get by subject (how an entry is read on one replica).
	gets, err := e.nc.SubscribeSync("$JS.API.STREAM.MSG.GET.KV_" + e.topo.Names.Results())
	if err != nil {
		t.Fatal(err)
	}
	_ = gets.SetPendingLimits(-1, -1)
	direct, err := e.nc.SubscribeSync("$JS.API.DIRECT.GET.KV_" + e.topo.Names.Results() + ".>")
	if err != nil {
		t.Fatal(err)
	}
	_ = direct.SetPendingLimits(-1, -1)
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w2 := e.worker("w2", nil, storing(g.tagger))
	// w2's requests' reply subjects (a client's recovery reads entries too).
	w2Inbox := w2.nc.NewRespInbox()
	w2Inbox = w2Inbox[:strings.LastIndexByte(w2Inbox, '.')+1]
	testwait.Eventually(t, 20*time.Second, "the redelivered batch acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	checkOwnResults(t, done, payloads)
	g.counter.mu.Lock()
	applied := copyCounts(g.counter.applied)
	g.counter.mu.Unlock()
	jobsOf := map[string]int{} // batch ID -> jobs applied
	for id, n := range applied {
		if n != 1 {
			t.Fatalf("job %s applied %d times", id, n)
		}
		batchID, _, ok := wire.ParseBatchedJobID(id)
		if !ok {
			t.Fatalf("job %s: no batch's job ID", id)
		}
		jobsOf[batchID]++
	}
	var queued string // the batch of the queued Calls (the lead went alone, a batch of one)
	for id, n := range jobsOf {
		if n == len(payloads) {
			queued = id
		}
	}
	if queued == "" || len(jobsOf) != 2 {
		t.Fatalf("jobs applied per batch %v, want the lead's batch of one and one of %d", jobsOf, len(payloads))
	}
	// Every copy sent before the flush's answer is queued on gets now.
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Each batch's entry is read once at most: the queued batch's once
	// (the lead's batch of one, when its ack was lost in the crash too,
	// is redelivered and reads its own entry once).
	entryGets := map[string]int{} // batch ID -> reads of its entry
	n, _, _ := gets.Pending()
	for range n {
		m, err := gets.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, key, ok := bytes.Cut(m.Data, []byte("."+wire.BatchOutcomesPrefix)); ok {
			entryGets[string(bytes.TrimRight(key, `"}`))]++
		}
	}
	n, _, _ = direct.Pending()
	for range n {
		m, err := direct.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, key, ok := strings.Cut(m.Subject, "."+wire.BatchOutcomesPrefix); ok && strings.HasPrefix(m.Reply, w2Inbox) {
			entryGets[key]++
		}
	}
	for id, n := range entryGets {
		if n != 1 || jobsOf[id] == 0 {
			t.Fatalf("reads of batch entries %v (queued batch %s), want one per redelivered batch", entryGets, queued)
		}
	}
	if n := entryGets[queued]; n != 1 {
		t.Fatalf("%d reads of the batch's entry for %d redelivered jobs, want 1 (all reads: %v)", n, len(payloads), entryGets)
	}
}
