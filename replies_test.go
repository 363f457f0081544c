package keylane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// replyCounter counts, from its own connection, the worker's replies under
// the reply prefix: grouped messages (and the jobs they answer) and single
// replies to Calls (tokens starting with groupedMark). Stream acks and
// JetStream API responses are not replies.
type replyCounter struct {
	mu                    sync.Mutex
	grouped, groupedJobs  int
	single                int
	bad                   int
	maxGroupedPayloadSeen int
}

func countReplies(t *testing.T, nc *nats.Conn, prefix string) *replyCounter {
	t.Helper()
	rc := &replyCounter{}
	sub, err := nc.Subscribe(prefix+">", func(m *nats.Msg) {
		tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		rc.mu.Lock()
		defer rc.mu.Unlock()
		switch {
		case tok == groupedToken:
			es, err := decodeGrouped(m.Data)
			if err != nil {
				rc.bad++
				return
			}
			rc.grouped++
			rc.groupedJobs += len(es)
			rc.maxGroupedPayloadSeen = max(rc.maxGroupedPayloadSeen, len(m.Data))
		case strings.HasPrefix(tok, groupedMark):
			rc.single++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return rc
}

func (rc *replyCounter) get() (grouped, groupedJobs, single, bad int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.grouped, rc.groupedJobs, rc.single, rc.bad
}

// gatedCounter is countReducer held at its first job until release is
// closed, so the jobs after it queue up and settle in one group.
func gatedCounter() (r Reducer, entered <-chan struct{}, release func()) {
	return gated(countReducer)
}

// gated is inner held at its first job until release is called.
func gated(inner Reducer) (r Reducer, entered <-chan struct{}, release func()) {
	in, gate := make(chan struct{}, 1), make(chan struct{})
	r = ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
		select {
		case in <- struct{}{}:
			<-gate
		default:
		}
		return inner.Reduce(ctx, job, cur)
	})
	return r, in, sync.OnceFunc(func() { close(gate) })
}

// waitDelivered waits until the partition's consumer has handed n jobs to
// the worker (all queued in its lane, none acked yet): the stream holds n
// jobs of the partition, in batch messages, and every one of those
// messages is delivered and not acked.
func (e *env) waitDelivered(key string, n int) {
	e.t.Helper()
	p := partition.Of(key, e.topo.Partitions)
	cons, err := e.js.Consumer(ctx(e.t), e.topo.Names.Jobs(), e.topo.Names.Consumer(p))
	if err != nil {
		e.t.Fatal(err)
	}
	prefix := strings.TrimSuffix(partition.Filter(e.ns, p), "*")
	testwait.Eventually(e.t, 15*time.Second, fmt.Sprintf("%d jobs delivered to the worker", n), func() bool {
		info, err := cons.Info(ctx(e.t))
		if err != nil || info.NumPending != 0 {
			return false
		}
		msgs, jobs := map[uint64]bool{}, 0
		for _, j := range storedJobs(e.t, e.js, e.topo.Names.Jobs()) {
			if strings.HasPrefix(j.Subject, prefix) {
				msgs[j.Seq] = true
				jobs++
			}
		}
		return jobs == n && info.NumAckPending == len(msgs)
	})
}

// hotKeyCalls makes perClient concurrent Calls on one key from each client
// while the worker holds the key's first job, then releases it. It
// returns every Call's result; it fails the test on any Call's error.
func (e *env) hotKeyCalls(clients []*Client, perClient int) []string {
	e.t.Helper()
	r, entered, release := gatedCounter()
	defer release()
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r })
	return e.heldCalls(w, clients, perClient, entered, release)
}

// heldCalls is hotKeyCalls with the worker and its gate given.
func (e *env) heldCalls(w *Worker, clients []*Client, perClient int, entered <-chan struct{}, release func()) []string {
	e.t.Helper()
	e.waitOwned(w)
	total := len(clients) * perClient
	results := make([]string, total+1)
	errs := make([]error, total+1)
	var wg sync.WaitGroup
	call := func(i int, c *Client) {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := c.Call(cctx, "hot", nil, WithID("buy-"+strconv.Itoa(i)))
			results[i], errs[i] = string(res), err
		})
	}
	call(0, clients[0]) // the one the reducer holds
	select {
	case <-entered:
	case <-ctx(e.t).Done():
		e.t.Fatal("the first job never ran")
	}
	for i := range total {
		call(i+1, clients[i%len(clients)])
	}
	e.waitDelivered("hot", total+1)
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("call %d: %v", i, err)
		}
	}
	return results
}

// TestGroupedRepliesHotKeyOneClient: 64 buyers on one Client, one hot key.
// Each Call gets its own result (the counter's values 1..65, each once),
// and the worker answers the 64 queued behind the first in far fewer
// messages than jobs. Without replyGrouped, 65 single replies arrive and
// the message count check fails.
func TestGroupedRepliesHotKeyOneClient(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	rc := countReplies(t, natstest.Connect(t, e.srv), e.topo.Meta.ReplyPrefix)
	results := e.hotKeyCalls([]*Client{e.client}, 64)
	checkCounts(t, results)
	var grouped, jobs, single, bad int
	testwait.Eventually(t, 5*time.Second, "every reply counted", func() bool {
		grouped, jobs, single, bad = rc.get()
		return jobs+single == len(results)
	})
	t.Logf("%d jobs answered by %d grouped messages (%d jobs) and %d single replies", len(results), grouped, jobs, single)
	if bad != 0 || grouped+single > len(results)/8 {
		t.Fatalf("%d reply messages (%d grouped, %d single, %d malformed) for %d jobs; want at most %d", grouped+single, grouped, single, bad, len(results), len(results)/8)
	}
}

// TestGroupedRepliesTwoClients: Calls of two Clients settle in one group;
// each Call gets its own result, through its own client's grouped reply.
func TestGroupedRepliesTwoClients(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	other, err := NewClient(ctx(t), natstest.Connect(t, e.srv), ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	rc := countReplies(t, natstest.Connect(t, e.srv), e.topo.Meta.ReplyPrefix)
	results := e.hotKeyCalls([]*Client{e.client, other}, 16)
	checkCounts(t, results)
	var grouped, jobs, single int
	testwait.Eventually(t, 5*time.Second, "every reply counted", func() bool {
		grouped, jobs, single, _ = rc.get()
		return jobs+single == len(results)
	})
	if grouped < 2 || single > 2 {
		t.Fatalf("%d grouped messages, %d single replies for %d jobs from 2 clients; want one group per client", grouped, single, len(results))
	}
}

// checkCounts fails unless results are the counter's values 1..len, each once.
func checkCounts(t *testing.T, results []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, r := range results {
		seen[r] = true
	}
	for i := 1; i <= len(results); i++ {
		if !seen[strconv.Itoa(i)] {
			t.Fatalf("no Call got %d: results %v", i, results)
		}
	}
}

// TestOldStyleTokensGetSingleReplies: jobs whose reply token lacks
// groupedMark (a previous build's client) settle in one group with a new
// client's Calls, yet each gets its own single reply, and nothing is
// sent to that inbox's grouped token. Without the mark check in
// groupedInbox, the old inbox gets one grouped message and the test fails.
func TestOldStyleTokensGetSingleReplies(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r, entered, release := gatedCounter()
	defer release()
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r })
	e.waitOwned(w)
	old := natstest.Connect(t, e.srv)
	inbox := e.topo.Meta.ReplyPrefix + "old."
	got := make(chan *nats.Msg, 64)
	if _, err := old.ChanSubscribe(inbox+"*", got); err != nil {
		t.Fatal(err)
	}
	if err := old.Flush(); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		_, err := e.client.Call(ctx(t), "hot", nil)
		first <- err
	}()
	<-entered
	const n = 8
	for i := range n {
		// Each a batch of one, as a client sends a lone Call, with a
		// reply token of the old style.
		e.publishBatch(0, "old"+strconv.Itoa(i), []wire.BatchJob{{Key: "hot", Reply: inbox + strconv.FormatInt(int64(i+1000), 36), KeepOutcome: true}})
	}
	var news sync.WaitGroup
	for range 4 { // new-style Calls in the same group: they may be grouped
		news.Go(func() {
			if _, err := e.client.Call(ctx(t), "hot", nil); err != nil {
				t.Error(err)
			}
		})
	}
	e.waitDelivered("hot", n+5)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	news.Wait()
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case m := <-got:
			if seen[m.Subject] || m.Subject == inbox+groupedToken {
				t.Fatalf("unexpected reply on %s (seen %v)", m.Subject, seen)
			}
			if _, err := decodeReply(m); err != nil {
				t.Fatalf("reply on %s: %v", m.Subject, err)
			}
			seen[m.Subject] = true
		case <-ctx(t).Done():
			t.Fatalf("single replies: got %d of %d", len(seen), n)
		}
	}
	if err := old.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		t.Fatalf("extra reply on %s", m.Subject)
	default:
	}
}

// TestGroupedOutcomeCodec: every outcome a single reply carries (result,
// empty result, error, permanent, dead-lettered) comes out of a grouped
// reply the same, and malformed bodies are refused whole.
func TestGroupedOutcomeCodec(t *testing.T) {
	outcomes := []struct {
		res  []byte
		err  error
		dead bool
	}{
		{[]byte("7"), nil, false},
		{nil, nil, false},
		{nil, errors.New("boom"), false},
		{nil, Permanent(errors.New("sold out")), false},
		{nil, Permanent(errors.New("bad order")), true},
		{nil, errors.New(""), false},
	}
	var es []groupedEntry
	for i, o := range outcomes {
		es = append(es, groupedEntry{Token: groupedMark + strconv.Itoa(i), Outcome: encodeResult(o.res, o.err, o.dead)})
	}
	body := encodeGrouped(nil, es)
	got, err := decodeGrouped(body)
	if err != nil || len(got) != len(es) {
		t.Fatalf("decode = %d entries, %v", len(got), err)
	}
	for i, o := range outcomes {
		single, serr := decodeReply(replyMsg("s", o.res, o.err, o.dead))
		grouped, gerr, _ := groupedOutcome(got[i].Outcome)
		if got[i].Token != es[i].Token || string(single) != string(grouped) || fmt.Sprint(serr) != fmt.Sprint(gerr) {
			t.Fatalf("entry %d: single %q, %v; grouped %q, %v", i, single, serr, grouped, gerr)
		}
		if o.err != nil && serr == nil {
			t.Fatalf("entry %d: a single reply of error %q reads as a success", i, o.err)
		}
		var re *RemoteError
		if o.err != nil && (!errors.As(gerr, &re) || re.DeadLettered != o.dead || re.Permanent != (o.dead || errors.Is(o.err, ErrPermanent))) {
			t.Fatalf("entry %d: grouped error %#v", i, gerr)
		}
	}
	if len(got[0].Outcome) != cap(got[0].Outcome) {
		t.Fatal("an outcome shares capacity with the next entry")
	}
	bad := [][]byte{
		nil,
		{groupedVersion},
		append([]byte{'X'}, body[1:]...),
		body[:len(body)-1],
		append(append([]byte(nil), body...), 0),
		encodeGrouped(nil, []groupedEntry{{Token: "1", Outcome: []byte("o")}}),                                       // an old-style token
		encodeGrouped(nil, []groupedEntry{{Token: "-A", Outcome: []byte("o")}}),                                      // not base 36
		encodeGrouped(nil, []groupedEntry{{Token: "-1", Outcome: []byte("x")}}),                                      // unknown kind
		encodeGrouped(nil, []groupedEntry{{Token: "-1", Outcome: nil}}),                                              // no outcome
		encodeGrouped(nil, []groupedEntry{{Token: "-1", Outcome: []byte("o")}, {Token: "-1", Outcome: []byte("o")}}), // twice
		{groupedVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	}
	for i, b := range bad {
		if _, err := decodeGrouped(b); err == nil {
			t.Errorf("bad body %d (%q) accepted", i, b)
		}
	}
}

// TestGroupedReplyCarriesAnError: a grouped reply naming a waiting Call
// with a dead-lettered outcome ends that Call with the RemoteError a
// single reply gives (Permanent and DeadLettered), through the client's
// real inbox subscription.
func TestGroupedReplyCarriesAnError(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1}) // no worker: the Call waits
	done := make(chan error, 1)
	go func() {
		_, err := e.client.Call(ctx(t), "k", nil)
		done <- err
	}()
	var token string
	var inbox string
	testwait.Eventually(t, 10*time.Second, "the Call waits", func() bool {
		var tokens []string
		inbox, tokens = e.client.e.Waiting()
		for _, tok := range tokens {
			token = tok
		}
		return token != ""
	})
	body := encodeGrouped(nil, []groupedEntry{
		{Token: token, Outcome: encodeResult(nil, Permanent(errors.New("out of stock")), true)},
		{Token: groupedMark + "zz", Outcome: encodeResult([]byte("x"), nil, false)}, // nobody waits
	})
	if err := e.nc.Publish(inbox+groupedToken, body); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var re *RemoteError
		if !errors.As(err, &re) || !re.Permanent || !re.DeadLettered || re.Message != "out of stock" || !errors.Is(err, ErrPermanent) {
			t.Fatalf("Call = %v; want a dead-lettered permanent RemoteError", err)
		}
	case <-ctx(t).Done():
		t.Fatal("the grouped reply never reached the Call")
	}
}

// TestMalformedGroupedReplyIsDropped: the server refuses the worker's
// grouped replies (its user may not publish to grouped tokens), so the
// Calls behind the first lose them; malformed grouped replies are
// published to the client's inbox instead, one of them naming the waiting
// Calls with a wrong result and a stray byte at its end. The client drops
// them whole, without crashing, and every Call still gets its own result,
// from the outcome the worker kept. A decoder that took the entries before
// the stray byte would hand out "999".
func TestMalformedGroupedReplyIsDropped(t *testing.T) {
	srv := natstest.StartConfig(t, `authorization {
  users: [
    {user: w, password: w, permissions: {publish: {deny: ["_INBOX.*.-"]}}}
    {user: c, password: c}
  ]
}
`)
	nc := natstest.Connect(t, srv, nats.UserInfo("c", "c"))
	wc := natstest.Connect(t, srv, nats.UserInfo("w", "w"))
	e := newEnvOn(t, srv, nc, TopologyConfig{Partitions: 1, LeaseTTL: time.Second})
	topo, c := e.topo, e.client
	r, entered, release := gatedCounter()
	defer release()
	w, err := NewWorker(wc, WorkerConfig{Topology: topo.Config, Reducer: r, ID: "w", AckWait: 5 * time.Second, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.WithoutCancel(ctx(t))) })
	e.waitOwned(w)
	const n = 4
	results, errs := make([]string, n), make([]error, n)
	var wg sync.WaitGroup
	call := func(i int) {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := c.Call(cctx, "hot", nil)
			results[i], errs[i] = string(res), err
		})
	}
	call(0)
	<-entered
	for i := 1; i < n; i++ {
		call(i)
	}
	e.waitDelivered("hot", n)
	inbox, tokens := c.e.Waiting()
	var es []groupedEntry
	for _, tok := range tokens {
		es = append(es, groupedEntry{Token: tok, Outcome: encodeResult([]byte("999"), nil, false)})
	}
	for _, body := range [][]byte{
		append(encodeGrouped(nil, es), 0x7),
		[]byte("garbage"),
		{groupedVersion, 0xff},
		nil,
	} {
		if err := nc.Publish(inbox+groupedToken, body); err != nil {
			t.Fatal(err)
		}
	}
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	checkCounts(t, results)
	if res, err := c.Call(ctx(t), "other", nil); err != nil || string(res) != "1" {
		t.Fatalf("a later Call = %q, %v; the client should still work", res, err)
	}
}

// TestGroupedRepliesSplitAtMaxPayload: 48 Calls whose results take 1.5 KB
// each, on a server whose max_payload is 16 KB: the worker's grouped
// replies are split so none exceeds it (a larger one would be refused by
// the server and every Call in it would wait for the results bucket),
// and every Call gets its result.
func TestGroupedRepliesSplitAtMaxPayload(t *testing.T) {
	const maxPayload = 16 << 10
	srv := natstest.StartConfig(t, "max_payload: 16384\n")
	nc := natstest.Connect(t, srv)
	e := newEnvOn(t, srv, nc, TopologyConfig{Partitions: 1, LeaseTTL: time.Second})
	topo, c := e.topo, e.client
	big := strings.Repeat("r", 1500) // the same each time: the state entry holds it once
	r, entered, release := gated(ReducerFunc(func(_ context.Context, _ Job, cur []byte) ([]byte, []byte, error) {
		n, _ := strconv.Atoi(string(cur))
		return []byte(strconv.Itoa(n + 1)), []byte(big), nil
	}))
	defer release()
	rc := countReplies(t, natstest.Connect(t, srv), topo.Meta.ReplyPrefix)
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r })
	results := e.heldCalls(w, []*Client{c}, 48, entered, release)
	for i, res := range results {
		if res != big {
			t.Fatalf("call %d got %d bytes, want %d", i, len(res), len(big))
		}
	}
	var grouped, jobs, single int
	testwait.Eventually(t, 5*time.Second, "every reply counted", func() bool {
		grouped, jobs, single, _ = rc.get()
		return jobs+single == len(results)
	})
	rc.mu.Lock()
	largest := rc.maxGroupedPayloadSeen
	rc.mu.Unlock()
	t.Logf("%d jobs: %d grouped messages (%d jobs, largest %d bytes), %d single", len(results), grouped, jobs, largest, single)
	if grouped < 4 || largest > maxPayload || single > 2 {
		t.Fatalf("%d grouped messages, largest %d bytes (max_payload %d), %d single; want the 47 split over at least 4", grouped, largest, maxPayload, single)
	}
}

// TestDecodeGroupedReply: the exported reader gives each Call's token and
// its result or RemoteError, and refuses a malformed body.
func TestDecodeGroupedReply(t *testing.T) {
	body := encodeGrouped(nil, []groupedEntry{
		{Token: "-1", Outcome: encodeResult([]byte("sold 1"), nil, false)},
		{Token: "-2", Outcome: encodeResult(nil, Permanent(errors.New("no stock")), false)},
	})
	outs, err := DecodeGroupedReply(body)
	if err != nil || len(outs) != 2 {
		t.Fatalf("DecodeGroupedReply = %v, %v; want 2 outcomes", outs, err)
	}
	if outs[0].Token != "-1" || string(outs[0].Result) != "sold 1" || outs[0].Err != nil {
		t.Fatalf("first outcome %+v", outs[0])
	}
	var re *RemoteError
	if outs[1].Token != "-2" || !errors.As(outs[1].Err, &re) || !re.Permanent || re.Message != "no stock" {
		t.Fatalf("second outcome %+v", outs[1])
	}
	if _, err := DecodeGroupedReply(body[:len(body)-1]); err == nil {
		t.Fatal("a cut body was read")
	}
}

// TestEmptyErrorReplyIsAnError: a handler error without text reaches the
// Call as an error, whether the worker sent its text as "(no error text)"
// (this build) or empty (a worker of the release before, whose replies a
// client of this one still reads). The empty header read as a success.
func TestEmptyErrorReplyIsAnError(t *testing.T) {
	for _, m := range []*nats.Msg{
		replyMsg("r", nil, Permanent(errors.New("")), false),
		{Subject: "r", Header: nats.Header{HeaderError: {""}, HeaderErrorKind: {"permanent"}}},
		{Subject: "r", Header: nats.Header{HeaderError: {""}}},
	} {
		var re *RemoteError
		if _, err := decodeReply(m); !errors.As(err, &re) || re.Message == "" {
			t.Fatalf("reply with headers %v: %v; want a RemoteError with text", m.Header, err)
		}
	}
	if res, err := decodeReply(&nats.Msg{Data: []byte("ok")}); err != nil || string(res) != "ok" {
		t.Fatalf("a success = %q, %v", res, err)
	}
}

// encodeGrouped appends the entries' body to buf (a grouped reply's
// data), as replyGrouped does; an empty outcome is written as it is, for
// tests of malformed bodies.
func encodeGrouped(buf []byte, es []groupedEntry) []byte {
	buf = append(buf, groupedVersion)
	for _, e := range es {
		if len(e.Outcome) == 0 { // as it is: decodeGrouped refuses it
			buf = binary.AppendUvarint(buf, uint64(len(e.Token)))
			buf = append(buf, e.Token...)
			buf = append(buf, 0)
			continue
		}
		buf = appendGroupedEntry(buf, e.Token, e.Outcome[0], e.Outcome[1:])
	}
	return buf
}
