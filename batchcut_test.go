package keylane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// orderRecorder is a Handler that records, per key, the payloads it ran
// (a payload's text before the first '|'), in the order run. A plain
// Handler is at-least-once across a redelivery (jetstream/doc.go, "A
// redelivered batch"): a run with Attempt above 1 of a job already
// recorded (a lease lost under load before the ack) is counted in again,
// not recorded twice; a first run seen twice still fails the check.
type orderRecorder struct {
	mu    sync.Mutex
	order map[string][]string
	runs  int
	again int
}

func newOrderRecorder() *orderRecorder { return &orderRecorder{order: map[string][]string{}} }

func (r *orderRecorder) handle(_ context.Context, j Job) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tag, _, _ := strings.Cut(string(j.Payload), "|")
	if j.Attempt > 1 && slices.Contains(r.order[j.Key], tag) {
		r.again++
		return nil, nil
	}
	r.order[j.Key] = append(r.order[j.Key], tag)
	r.runs++
	return nil, nil
}

func (r *orderRecorder) ran() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs
}

// checkOnceInOrder fails the test unless every key of want ran exactly
// its jobs, each once; and each submitter's jobs of a key (the tags with
// one prefix before ':') in the order want gives them.
func (r *orderRecorder) checkOnceInOrder(t *testing.T, want map[string][]string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, tags := range want {
		got := r.order[key]
		if len(got) != len(tags) {
			t.Fatalf("key %s ran %d jobs, want %d", key, len(got), len(tags))
		}
		seen := map[string]int{}
		for _, g := range got {
			seen[g]++
		}
		for _, tag := range tags {
			if seen[tag] != 1 {
				t.Fatalf("key %s ran job %s %d times", key, tag, seen[tag])
			}
		}
		bySubmitter := func(tags []string) map[string][]string {
			out := map[string][]string{}
			for _, tag := range tags {
				who, _, _ := strings.Cut(tag, ":")
				out[who] = append(out[who], tag)
			}
			return out
		}
		wantBy, gotBy := bySubmitter(tags), bySubmitter(got)
		for who, w := range wantBy {
			if !slices.Equal(gotBy[who], w) {
				t.Fatalf("key %s: submitter %s's jobs ran in the order %v, want %v", key, who, gotBy[who], w)
			}
		}
	}
}

// TestBatchesCutByMaxPayload: on a server whose max_payload is 64 KiB,
// jobs of 1000 bytes make the 256-job cut impossible. SubmitMany and
// concurrent Submits cut their batches by bytes: every batch published
// fits (none refused by the server, each under max_payload, none of 256
// jobs), every job runs once, and every key's jobs run in the order
// submitted. A lone job larger than a batch's room goes alone and is
// stored; one too big for max_payload gets ErrPayloadTooLarge at once,
// while the others are in flight, and nothing of it is stored.
func TestBatchesCutByMaxPayload(t *testing.T) {
	const maxPayload = 64 << 10
	srv := natstest.StartConfig(t, "max_payload: "+strconv.Itoa(maxPayload)+"\n")
	nc := natstest.Connect(t, srv)
	e := newEnvOn(t, srv, nc, TopologyConfig{Partitions: 1})
	rec := newOrderRecorder()
	e.worker("w", HandlerFunc(rec.handle), nil)
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pad := func(tag string, n int) []byte {
		return append([]byte(tag+"|"), bytes.Repeat([]byte("p"), n)...)
	}
	want := map[string][]string{}

	// SubmitMany: 600 jobs on 5 keys, all batchable, given at once.
	var reqs []Request
	for i := range 600 {
		key, tag := "many:"+strconv.Itoa(i%5), "m:"+strconv.Itoa(i)
		reqs = append(reqs, Request{Key: key, Payload: pad(tag, 1000)})
		want[key] = append(want[key], tag)
	}
	out, err := c.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("SubmitMany job %d: %v", i, o.Err)
		}
	}

	// Concurrent Submits: 16 submitters of 40 jobs each, each on a key of
	// its own in order; one of them also sends, midway, a job over a
	// batch's room (alone, stored) and one over max_payload (refused).
	var wg sync.WaitGroup
	var tooBig error
	tooBigTook := time.Duration(0)
	for s := range 16 {
		key := "conc:" + strconv.Itoa(s)
		for i := range 40 {
			want[key] = append(want[key], "c"+strconv.Itoa(s)+":"+strconv.Itoa(i))
		}
		wg.Go(func() {
			for i := range 40 {
				tag := "c" + strconv.Itoa(s) + ":" + strconv.Itoa(i)
				size := 1000
				if s == 0 && i == 20 {
					// Over the batcher's room (max_payload less the dead
					// letter's reserve, 1 KiB of headers and the body's
					// head), under Submit's own limit.
					size = maxPayload - DeadLetterReserve - 600
				}
				if _, err := c.Submit(ctx(t), key, pad(tag, size)); err != nil {
					t.Errorf("submit %s: %v", tag, err)
					return
				}
				if s == 0 && i == 20 {
					start := time.Now()
					cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, tooBig = c.Submit(cctx, key, pad("huge", maxPayload))
					cancel()
					tooBigTook = time.Since(start)
				}
			}
		})
	}
	wg.Wait()
	if !errors.Is(tooBig, ErrPayloadTooLarge) {
		t.Fatalf("a job over max_payload: %v (after %s); want ErrPayloadTooLarge, not a hang", tooBig, tooBigTook)
	}
	total := 0
	for _, tags := range want {
		total += len(tags)
	}
	testwait.Eventually(t, 60*time.Second, "every job run", func() bool { return rec.ran() >= total })
	testwait.Eventually(t, 10*time.Second, "every message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	rec.checkOnceInOrder(t, want)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	// Every batch fitted: its size is within max_payload, it holds fewer
	// than 256 jobs (cut by bytes), and the count in its header is its
	// body's.
	count, most := 0, 0
	for {
		m, err := batches.NextMsg(0)
		if err != nil {
			break
		}
		jobs, err := wire.DecodeBatch(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		size := len(m.Data)
		for name, vs := range m.Header {
			for _, v := range vs {
				size += len(name) + len(v) + 4
			}
		}
		if size > maxPayload || len(jobs) >= 256 || m.Header.Get(wire.HeaderBatchJobs) != strconv.Itoa(len(jobs)) {
			t.Fatalf("a batch of %d jobs, %d bytes with headers, Keylane-Batch-Jobs %q (max_payload %d)", len(jobs), size, m.Header.Get(wire.HeaderBatchJobs), maxPayload)
		}
		count++
		most = max(most, len(jobs))
	}
	if count < 600/most || most < 2 {
		t.Fatalf("%d batch messages of at most %d jobs: SubmitMany's 600 jobs were not cut by bytes", count, most)
	}
	t.Logf("%d batch messages, the largest of %d jobs", count, most)
}

// TestMixedVersionClients: a sender of one-job messages (as an earlier
// client and the previous release's Go client send them: oneJobSender,
// by hand) and a client of this release, which sends batches, submit to
// the same keys at the same time. The worker runs batch messages only:
// every one-job message is dead-lettered unrun (its Call refused at once,
// permanently), and the batching client's jobs all run once, each key's
// in the order submitted, whatever the refusals between them.
func TestMixedVersionClients(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	rec := newOrderRecorder()
	e.worker("w", HandlerFunc(rec.handle), nil)
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	older := newOneJobSender(t, e, natstest.Connect(t, e.srv))
	newer, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()
	// What each sends, by format: one-job messages on the keys' subjects,
	// batch messages on the partition's batch subject.
	var oneJob atomic.Int64
	watch, err := e.nc.Subscribe(e.ns+".jobs.0.*", func(m *nats.Msg) {
		if !strings.HasSuffix(m.Subject, "."+wire.BatchToken) {
			oneJob.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Unsubscribe() }()
	if err := e.nc.Flush(); err != nil { // subscribed before the older sender, on its own connection, publishes
		t.Fatal(err)
	}
	const keys, each = 12, 40
	want := map[string][]string{}
	var wg sync.WaitGroup
	for k := range keys {
		key := "seat:" + strconv.Itoa(k)
		for _, who := range []string{"old", "new"} {
			for i := range each {
				if who == "new" {
					want[key] = append(want[key], fmt.Sprintf("%s%d:%d", who, k, i))
				}
			}
			// Runs of 10: all ten at once (the newer client's SubmitMany,
			// a batch of one key's jobs in order; the older sender's ten
			// asynchronous publishes, as the previous release's
			// SubmitMany made them), or Submits one after another and a
			// Call.
			submitMany := func(reqs []Request) error {
				if who == "new" {
					out, err := newer.SubmitMany(ctx(t), reqs)
					if err == nil {
						err = errors.Join(out[0].Err, out[9].Err)
					}
					return err
				}
				var acks []jetstream.PubAckFuture
				for _, r := range reqs {
					a, err := older.submitAsync(r.Key, r.Payload)
					if err != nil {
						return err
					}
					acks = append(acks, a)
				}
				for _, a := range acks {
					select {
					case <-a.Ok():
					case err := <-a.Err():
						return err
					case <-ctx(t).Done():
						return ctx(t).Err()
					}
				}
				return nil
			}
			submit := func(r Request) error {
				if who == "new" {
					_, err := newer.Submit(ctx(t), key, r.Payload)
					return err
				}
				return older.submit(ctx(t), key, r.Payload)
			}
			call := func(r Request) error {
				var err error
				if who == "new" {
					_, err = newer.Call(ctx(t), key, r.Payload)
					return err
				}
				var re *RemoteError
				if _, err = older.call(ctx(t), key, r.Payload); !errors.As(err, &re) || !re.Permanent {
					return fmt.Errorf("a one-job Call: %v, want a permanent refusal", err)
				}
				return nil
			}
			wg.Go(func() {
				for run := 0; run < each; run += 10 {
					var reqs []Request
					for i := run; i < run+10; i++ {
						reqs = append(reqs, Request{Key: key, Payload: fmt.Appendf(nil, "%s%d:%d", who, k, i)})
					}
					if run%20 == 0 {
						if err := submitMany(reqs); err != nil {
							t.Errorf("%s: %v", reqs[0].Payload, err)
							return
						}
						continue
					}
					for i, r := range reqs {
						var err error
						if i == 9 {
							err = call(r)
						} else {
							err = submit(r)
						}
						if err != nil {
							t.Errorf("%s: %v", r.Payload, err)
							return
						}
					}
				}
			})
		}
	}
	wg.Wait()
	testwait.Eventually(t, 60*time.Second, "every batched job run", func() bool { return rec.ran() >= keys*each })
	testwait.Eventually(t, 30*time.Second, "every one-job message dead-lettered", func() bool { return len(e.deadLetters()) >= keys*each })
	testwait.Eventually(t, 10*time.Second, "every message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	rec.checkOnceInOrder(t, want)
	if n := len(e.deadLetters()); n != keys*each {
		t.Fatalf("%d dead letters, want the older sender's %d", n, keys*each)
	}
	// Both formats were on the wire: every one of the older sender's jobs
	// as a one-job message and no other (the newer client's went in
	// batches only), and batch messages.
	testwait.Eventually(t, 5*time.Second, "the older sender's one-job messages seen", func() bool { return oneJob.Load() >= keys*each })
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := oneJob.Load(); n != keys*each {
		t.Fatalf("%d one-job messages, want the older sender's %d", n, keys*each)
	}
	if n, _, _ := batches.Pending(); n == 0 {
		t.Fatal("no batch message was sent: the batching client sent one-job messages only")
	} else {
		t.Logf("%d batch messages", n)
	}
}

// TestBatchesCutByTheWireLimit: on a server whose max_payload (12 MiB) is
// above a batch body's limit (wire.MaxBatchBytes, 8 MiB), jobs of 3 MiB
// from SubmitMany and from concurrent Submits and Calls are cut into
// batches the wire takes (at most two such jobs each): every job is
// stored and runs once, and every batch message decodes. A 9 MiB job,
// over the wire's limit on a batch of several and under max_payload's,
// goes alone as a batch of one (whose limit is max_payload's) and is
// stored and run; no message of another format is sent; one over
// max_payload gets ErrPayloadTooLarge at once. Cut by
// max_payload only, three of them made one batch that EncodeBatch
// refused (wire.ErrBatchTooLarge), and every job of it failed.
func TestBatchesCutByTheWireLimit(t *testing.T) {
	const maxPayload = 12 << 20
	srv := natstest.StartConfig(t, "max_payload: "+strconv.Itoa(maxPayload)+"\n")
	nc := natstest.Connect(t, srv)
	// Leases and acks with room for 3 MiB messages on a loaded machine
	// under -race: a lease lost midway runs jobs again, which is not
	// what this test looks at.
	e := newEnvOn(t, srv, nc, TopologyConfig{Partitions: 1, LeaseTTL: 5 * time.Second})
	rec := newOrderRecorder()
	e.worker("w", HandlerFunc(rec.handle), func(c *WorkerConfig) { c.AckWait = 30 * time.Second })
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	// Two 9 MiB batches of one and 3 MiB jobs: more than a
	// subscription's default 64 MiB of pending bytes.
	if err := batches.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	var oneJob atomic.Int64
	watch, err := e.nc.Subscribe(e.ns+".jobs.0.*", func(m *nats.Msg) {
		if _, ok := m.Header[wire.HeaderBatch]; !ok {
			oneJob.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Unsubscribe() }()
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sized := func(tag string, n int) []byte {
		return append([]byte(tag+"|"), bytes.Repeat([]byte("p"), n)...)
	}
	job := func(tag string) []byte { return sized(tag, 3<<20) }
	want := map[string][]string{}

	// SubmitMany: four 3 MiB jobs of one key, given at once (12 MiB
	// with their framing: more than max_payload less its reserve, so
	// three were cut into one 9 MiB batch), then a 9 MiB job, which no
	// batch of several can carry: it goes alone, a batch of one.
	var reqs []Request
	for i := range 5 {
		tag, payload := "m:"+strconv.Itoa(i), job("m:"+strconv.Itoa(i))
		if i == 4 {
			payload = sized(tag, 9<<20)
		}
		reqs = append(reqs, Request{Key: "many", Payload: payload})
		want["many"] = append(want["many"], tag)
	}
	out, err := c.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("SubmitMany job %d of 3 MiB, max_payload 12 MiB: %v", i, o.Err)
		}
	}

	// Concurrent Submits and Calls: 6 callers, each a Submit then a
	// Call on a key of its own, all on the one partition, so jobs queue
	// behind a send in flight and go as the next batch.
	var wg sync.WaitGroup
	for s := range 6 {
		key, tags := "conc:"+strconv.Itoa(s), []string{"c" + strconv.Itoa(s) + ":0", "c" + strconv.Itoa(s) + ":1"}
		want[key] = tags
		wg.Go(func() {
			if _, err := c.Submit(ctx(t), key, job(tags[0])); err != nil {
				t.Errorf("submit of 3 MiB, max_payload 12 MiB: %v", err)
				return
			}
			if _, err := c.Call(ctx(t), key, job(tags[1])); err != nil {
				t.Errorf("call of 3 MiB, max_payload 12 MiB: %v", err)
			}
		})
	}
	// A 9 MiB Submit among them goes alone; one over max_payload is
	// refused at once, nothing of it sent.
	want["big"] = []string{"big"}
	wg.Go(func() {
		if _, err := c.Submit(ctx(t), "big", sized("big", 9<<20)); err != nil {
			t.Errorf("submit of 9 MiB, max_payload 12 MiB: %v", err)
		}
		if _, err := c.Submit(ctx(t), "big", sized("huge", maxPayload)); !errors.Is(err, ErrPayloadTooLarge) {
			t.Errorf("submit over max_payload: %v, want ErrPayloadTooLarge", err)
		}
	})
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	total := 0
	for _, tags := range want {
		total += len(tags)
	}
	testwait.Eventually(t, 60*time.Second, "every job run", func() bool { return rec.ran() >= total })
	testwait.Eventually(t, 10*time.Second, "every message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	rec.checkOnceInOrder(t, want)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	count, bigOnes := 0, 0
	for {
		m, err := batches.NextMsg(0)
		if err != nil {
			break
		}
		jobs, err := wire.DecodeBatch(m.Data)
		if err != nil || len(jobs) > 1 && len(m.Data) > wire.MaxBatchBytes {
			t.Fatalf("a batch of %d jobs, %d bytes: %v", len(jobs), len(m.Data), err)
		}
		if len(m.Data) > wire.MaxBatchBytes {
			bigOnes++
		}
		count++
		t.Logf("a batch of %d jobs, %d bytes", len(jobs), len(m.Data))
	}
	if count == 0 {
		t.Fatal("no batch message: the test cut nothing")
	}
	if bigOnes != 2 {
		t.Fatalf("%d batches of one over %d bytes, want the two 9 MiB jobs'", bigOnes, wire.MaxBatchBytes)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := oneJob.Load(); n != 0 {
		t.Fatalf("%d messages in another format than a batch", n)
	}
}
