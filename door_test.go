package keylane

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The door (jetstream/doc.go, "The door"): what the client refuses and
// what the worker dead-letters, with which reason, against a real server.

// failOn is a handler that fails permanently for payload "bad", records
// the payloads it ran, and answers "ok".
type failOn struct {
	mu  sync.Mutex
	ran []string
}

func (f *failOn) handler() HandlerFunc {
	return func(_ context.Context, j Job) ([]byte, error) {
		f.mu.Lock()
		f.ran = append(f.ran, string(j.Payload))
		f.mu.Unlock()
		if string(j.Payload) == "bad" {
			return nil, Permanent(errors.New("refused bad"))
		}
		return []byte("ok"), nil
	}
}

func (f *failOn) saw(payload string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.ran {
		if p == payload {
			return true
		}
	}
	return false
}

// callWithin calls key and fails the test unless the call is answered
// "ok" within d: the key was not wedged.
func callWithin(t *testing.T, c *Client, d time.Duration, key string) {
	t.Helper()
	cctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if res, err := c.Call(cctx, key, []byte("after")); err != nil || string(res) != "ok" {
		t.Fatalf("a later job of key %q: %q, %v; want it to run (the key or partition is wedged)", key, res, err)
	}
}

// waitDead waits until the dead-letter stream holds n messages and
// returns them.
func waitDead(t *testing.T, e *env, n int) []DeadLetter {
	t.Helper()
	var dls []DeadLetter
	testwait.Eventually(t, 20*time.Second, "dead letters stored", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 100)
		return err == nil && len(dls) >= n
	})
	return dls
}

// rawJob is a job message as a raw publisher with the client's
// permissions may send it: any headers, on key's subject.
func rawJob(e *env, key string, h nats.Header, payload string) *nats.Msg {
	m := nats.NewMsg(partition.Subject(e.ns, partition.Of(key, e.topo.Partitions), key))
	for k, vs := range h {
		m.Header[k] = vs
	}
	m.Data = []byte(payload)
	return m
}

// TestJobIDTheResultsBucketCannotHold: "order..1" is no key the results
// bucket can hold. The client refuses it (Submit and Call), storing
// nothing; a raw publisher's job with an ID the bucket cannot hold
// ("order 1") and Keylane-Keep-Outcome is dead-lettered with a reason,
// and the key's later jobs run.
func TestJobIDTheResultsBucketCannotHold(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	if _, err := e.client.Submit(ctx(t), "order:1", []byte("x"), WithID("order..1")); !errors.Is(err, ErrBadJobID) {
		t.Fatalf("Submit with ID order..1: %v; want ErrBadJobID", err)
	}
	cctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	defer cancel()
	if _, err := e.client.Call(cctx, "order:1", []byte("x"), WithID("order..1")); !errors.Is(err, ErrBadJobID) {
		t.Fatalf("Call with ID order..1: %v; want ErrBadJobID", err)
	}
	if _, err := e.client.Result(ctx(t), "order..1"); !errors.Is(err, ErrBadJobID) {
		t.Fatalf("Result of order..1: %v; want ErrBadJobID", err)
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 0 {
		t.Fatalf("%d jobs stored; want none", n)
	}

	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	for _, id := range []string{"order 1", "order..1"} {
		if _, err := e.js.PublishMsg(ctx(t), rawJob(e, "order:1", nats.Header{
			HeaderJobID: {id}, HeaderKey: {"order:1"}, HeaderKeepOutcome: {"1"},
		}, "raw")); err != nil {
			t.Fatal(err)
		}
	}
	callWithin(t, e.client, 20*time.Second, "order:1")
	dls := waitDead(t, e, 2)
	for _, d := range dls {
		if !strings.Contains(d.Error, "bad Nats-Msg-Id header") || d.JobID != "" {
			t.Errorf("dead letter %d: job %q, error %q; want no ID and the reason", d.Seq, d.JobID, d.Error)
		}
	}
	if h.saw("raw") {
		t.Fatal("the handler ran a job with an ID the results bucket cannot hold")
	}
}

// TestFailingDelayedJobIsDeadLettered: a delayed job stored when due
// carries the server's Nats-Scheduler and Nats-Schedule-Next, which the
// dead-letter stream refuses (no schedules there). Its dead letter must
// still be stored, under the job's ID, and the key move on.
func TestFailingDelayedJobIsDeadLettered(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, Delays: true})
	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	if _, err := e.client.Submit(ctx(t), "seat:A7", []byte("bad"), WithID("hold.1"), WithDelay(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the delayed job ran", func() bool { return h.saw("bad") })
	dls := waitDead(t, e, 1)
	if dls[0].JobID != "hold.1" || dls[0].Key != "seat:A7" || !strings.Contains(dls[0].Error, "refused bad") {
		t.Fatalf("dead letter %+v; want job hold.1 of seat:A7 saying why", dls[0])
	}
	callWithin(t, e.client, 20*time.Second, "seat:A7")
}

// TestRawAtomicBatchOfMalformedJobs: one stored atomic batch of messages
// that are no jobs (no key) is dead-lettered message by message on the
// fetch loop; their Nats-Batch-* headers must not make every dead letter
// fail, which stopped the whole partition.
func TestRawAtomicBatchOfMalformedJobs(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	subj := partition.Subject(e.ns, 0, "nobody")
	const n = 3
	for i := 1; i <= n; i++ {
		m := nats.NewMsg(subj)
		m.Data = []byte("junk")
		markBatch(m, "raw-batch", i, i == n)
		if i < n {
			if err := e.nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
			continue
		}
		ack, err := e.nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := batchStored(ack, "raw-batch", n); err != nil {
			t.Fatalf("raw batch not stored: %v", err)
		}
	}
	callWithin(t, e.client, 20*time.Second, "healthy")
	for _, d := range waitDead(t, e, n) {
		if !strings.Contains(d.Error, "malformed") || !strings.Contains(d.Error, HeaderKey) {
			t.Errorf("dead letter %d: %q; want malformed naming %s", d.Seq, d.Error, HeaderKey)
		}
	}
}

// TestReservedHeadersRefusedAtTheClient: WithHeader (and Request.Headers)
// may not carry Nats-* or Keylane-* headers. On a namespace with delays
// (roll-ups allowed) Nats-Rollup: sub deleted the key's queued jobs.
func TestReservedHeadersRefusedAtTheClient(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, Delays: true})
	if _, err := e.client.Submit(ctx(t), "sku:7", []byte("queued"), WithID("queued-1")); err != nil {
		t.Fatal(err)
	}
	for _, hdr := range [][2]string{{"Nats-Rollup", "sub"}, {"nats-rollup", "all"}, {"Keylane-Redrive-Of", "queued-1"}, {"Keylane-Keep-Outcome", "1"}, {"Nats-TTL", "1s"}, {"Status", "100"}} {
		if _, err := e.client.Submit(ctx(t), "sku:7", []byte("x"), WithHeader(hdr[0], hdr[1])); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("Submit with %s: %v; want a refusal naming it reserved", hdr[0], err)
		}
		cctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
		if _, err := e.client.Call(cctx, "sku:7", []byte("x"), WithHeader(hdr[0], hdr[1])); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("Call with %s: %v; want a refusal naming it reserved", hdr[0], err)
		}
		cancel()
	}
	out, err := e.client.SubmitMany(ctx(t), []Request{{Key: "sku:7", Payload: []byte("x"), Headers: nats.Header{"Nats-Rollup": {"sub"}}}})
	if err != nil || len(out) != 1 || out[0].Err == nil {
		t.Fatalf("SubmitMany with Request.Headers Nats-Rollup: %+v, %v; want that request refused", out, err)
	}
	if _, err := e.client.Submit(ctx(t), "sku:7", []byte("x"), WithHeader("X-Order", "42"), WithHeader("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")); err != nil {
		t.Fatalf("Submit with the submitter's own headers: %v", err)
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 2 {
		t.Fatalf("%d jobs stored; want the queued job and the last one", n)
	}
}

// TestRawServerFeaturesAreRefusedAtPublish: a raw publisher's roll-up,
// per-message TTL or counter increment on a key's subject is refused by
// the server at publish on every namespace, with delays too (the jobs
// stream allows no roll-ups and no schedules: delayed jobs' schedules
// live in the delays stream). Should one reach a worker anyway (a stream
// configured by hand), wire.Rules.Parse dead-letters it with the reason.
func TestRawServerFeaturesAreRefusedAtPublish(t *testing.T) {
	for _, tc := range []TopologyConfig{{Partitions: 1}, {Partitions: 1, Delays: true}} {
		e := newEnv(t, tc)
		for _, hdr := range [][2]string{{"Nats-Rollup", "sub"}, {"Nats-Rollup", "all"}, {"Nats-TTL", "1s"}, {"Nats-Incr", "1"}} {
			_, err := e.js.PublishMsg(ctx(t), rawJob(e, "sku:7", nats.Header{HeaderKey: {"sku:7"}, hdr[0]: {hdr[1]}}, "raw"))
			var api *jetstream.APIError
			if !errors.As(err, &api) {
				t.Errorf("raw %s (delays %v): %v; want the server's refusal", hdr[0], tc.Delays, err)
			}
		}
	}
}

// TestKeyWithWhiteSpace: a key with white space at either end, or a
// control character (a tab), is refused at the client. From a raw
// publisher it is dead-lettered with a reason that is not "belongs to
// another partition" and names no key, so a redrive cannot apply it to
// the trimmed key (a different key).
func TestKeyWithWhiteSpace(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4})
	// A key whose trimmed form lands in another partition, as in the issue.
	var key string
	for _, k := range []string{"sku:7 ", "sku:8 ", "sku:9 ", "sku:10 ", "sku:11 ", "sku:12 ", "sku:13 ", "sku:14 "} {
		if partition.Of(k, 4) != partition.Of(strings.TrimSpace(k), 4) {
			key = k
			break
		}
	}
	for _, k := range []string{key, " sku:7", "sku:7\t", "sku\t7"} {
		if _, err := e.client.Submit(ctx(t), k, []byte("x")); err == nil {
			t.Errorf("Submit with key %q stored it", k)
		}
		cctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
		if _, err := e.client.Call(cctx, k, []byte("x")); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Call with key %q: %v; want a refusal", k, err)
		}
		cancel()
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 0 {
		t.Fatalf("%d jobs stored; want none", n)
	}

	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	for i, k := range []string{key, "sku\t7"} {
		if _, err := e.js.PublishMsg(ctx(t), rawJob(e, k, nats.Header{HeaderKey: {k}, HeaderJobID: {"ws-" + strconv.Itoa(i)}}, "ws")); err != nil {
			t.Fatal(err)
		}
	}
	dls := waitDead(t, e, 2)
	for _, d := range dls {
		if strings.Contains(d.Error, "belongs to") || d.Key != "" {
			t.Errorf("dead letter %d: key %q, error %q; want no key and not \"belongs to another partition\"", d.Seq, d.Key, d.Error)
		}
		if _, err := e.client.Redrive(ctx(t), d); err == nil {
			t.Errorf("dead letter %d was redriven to another key", d.Seq)
		}
	}
	if h.saw("ws") {
		t.Fatal("the handler ran a job whose key was changed on the way")
	}
	callWithin(t, e.client, 20*time.Second, strings.TrimSpace(key))
}

// TestDeadLetterRefusedForGoodIsStoredBare: the dead-letter stream refuses
// a dead letter for what it is (here its MaxMsgSize, below the job's
// payload: a 400 answer). Sending it again as it is can never succeed, so
// it is sent once more bare (no payload, no submitter's headers, the
// payload's length said), and the key moves on.
func TestDeadLetterRefusedForGoodIsStoredBare(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	s, err := e.js.Stream(ctx(t), e.topo.Names.Dead())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgSize = 4096
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	var h failOn
	w := e.worker("w", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		if strings.HasPrefix(string(j.Payload), "bad") {
			j.Payload = []byte("bad")
		}
		return h.handler()(ctx, j)
	}), nil)
	e.waitOwned(w)
	big := "bad" + strings.Repeat("x", 8192)
	if _, err := e.client.Submit(ctx(t), "k", []byte(big), WithID("big-1"), WithHeader("X-Order", "42")); err != nil {
		t.Fatal(err)
	}
	callWithin(t, e.client, 20*time.Second, "k")
	d := waitDead(t, e, 1)[0]
	if d.JobID != "big-1" || d.Key != "k" || d.PayloadDropped != len(big) || d.Payload != nil || !strings.Contains(d.Error, "refused bad") {
		t.Fatalf("dead letter %+v; want it bare: ID, key, the error and the dropped payload's length", d)
	}
	if w.Stats().DeadLetterErrors != 1 {
		t.Fatalf("%d failed dead-letter writes; want the one refused", w.Stats().DeadLetterErrors)
	}
}

// TestDeadLetterStreamRefusingBareDeadLettersHoldsTheLane: a dead-letter
// stream configured to refuse even a bare dead letter (MaxMsgSize below
// its headers) is the operator's to fix: the job stays unacked at the head
// of its lane, its key waits, the failures are counted, and once the
// stream takes dead letters again the job is dead-lettered and the key
// moves on. Acking it without a dead letter would lose it silently.
func TestDeadLetterStreamRefusingBareDeadLettersHoldsTheLane(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	s, err := e.js.Stream(ctx(t), e.topo.Names.Dead())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgSize = 16
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	var h failOn
	w := e.worker("w", h.handler(), func(c *WorkerConfig) { c.Backoff = func(int) time.Duration { return 50 * time.Millisecond } })
	e.waitOwned(w)
	if _, err := e.client.Submit(ctx(t), "k", []byte("bad")); err != nil {
		t.Fatal(err)
	}
	later := make(chan error, 1)
	go func() {
		_, err := e.client.Call(ctx(t), "k", []byte("after"))
		later <- err
	}()
	testwait.Eventually(t, 10*time.Second, "refused dead-letter writes counted", func() bool { return w.Stats().DeadLetterErrors > 3 })
	select {
	case err := <-later:
		t.Fatalf("a later job of the key ran (%v) while the failed job was neither applied nor dead-lettered", err)
	default:
	}
	sc.MaxMsgSize = 0
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-later:
		if err != nil {
			t.Fatalf("later job: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the later job never ran after the dead-letter stream was fixed")
	}
	if d := waitDead(t, e, 1); !strings.Contains(d[0].Error, "refused bad") {
		t.Fatalf("dead letter %+v", d[0])
	}
}
