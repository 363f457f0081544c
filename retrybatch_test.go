package keylane

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// TestRetryByIDInABatchRunsOnce: every job travels in a batch message, a
// job with a caller's ID too, and the server de-duplicates no job of a
// batch; the worker does, by the ID. A Call retried WithID while its first
// copy is still running or queued, and a Submit of the same ID after it
// finished, are each stored, answered from the first copy's kept outcome
// and never applied again: with a plain Handler (each job looked up just
// before it runs), a Reducer (its group counts the jobs it settled as
// held) and an Applier (copies queued in one group: the group ends before
// the second copy, which is looked up once the first's outcome is kept).
// Without groupEnd the Applier got both copies in one call, the outcomes
// table's unique key failed it, and order-7 ran twice.
func TestRetryByIDInABatchRunsOnce(t *testing.T) {
	for _, kind := range []string{"handler", "reducer", "applier"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: 1})
			gate := make(chan struct{})
			var mu sync.Mutex
			runs := map[string]int{}
			block := func(job Job) {
				mu.Lock()
				runs[job.ID]++
				mu.Unlock()
				if string(job.Payload) == "hold" {
					<-gate
				}
			}
			switch kind {
			case "handler":
				e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
					block(job)
					return []byte("done " + job.ID), nil
				}), nil)
			case "reducer":
				e.worker("w", nil, func(c *WorkerConfig) {
					c.Handler = nil
					c.Reducer = ReducerFunc(func(ctx context.Context, job Job, state []byte) ([]byte, []byte, error) {
						block(job)
						n, _ := strconv.Atoi(string(state))
						n++
						return []byte(strconv.Itoa(n)), []byte(strconv.Itoa(n)), nil
					})
				})
			case "applier":
				db := &outcomeTable{rows: map[string][]byte{}, run: block}
				e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Applier = nil, db })
			}
			c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const key = "seat:1"
			// A job of the key holds the lane, so every copy of the order
			// queues behind it, the reducer's in one group.
			held := make(chan error, 1)
			go func() { _, err := c.Call(ctx(t), key, []byte("hold")); held <- err }()
			testwait.Eventually(t, 10*time.Second, "the holding job running", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(runs) == 1
			})
			const copies = 4
			results := make(chan string, copies)
			errs := make(chan error, copies)
			for range copies {
				go func() {
					res, err := c.Call(ctx(t), key, []byte("buy"), WithID("order-7"))
					if err != nil {
						errs <- err
						return
					}
					results <- string(res)
				}()
			}
			// Every copy stored (the server holds them all) before the
			// lane moves on.
			testwait.Eventually(t, 10*time.Second, "every copy queued", func() bool {
				n, err := c.Backlog(ctx(t))
				return err == nil && n >= copies+1
			})
			close(gate)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			var first string
			for range copies {
				select {
				case err := <-errs:
					t.Fatalf("a copy's Call: %v", err)
				case res := <-results:
					if first == "" {
						first = res
					} else if res != first {
						t.Errorf("copies answered %q and %q: one job, one outcome", first, res)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("a copy's Call had no answer in 30s")
				}
			}
			// A Submit of the ID after it finished: stored, not run.
			if _, err := c.Submit(ctx(t), key, []byte("buy"), WithID("order-7")); err != nil {
				t.Fatalf("Submit of a finished ID: %v (want nil: stored, answered from its outcome)", err)
			}
			testwait.Eventually(t, 10*time.Second, "the jobs stream empty", func() bool {
				n, err := c.Backlog(ctx(t))
				return err == nil && n == 0
			})
			mu.Lock()
			defer mu.Unlock()
			if runs["order-7"] != 1 {
				t.Fatalf("order-7 ran %d times, want once (runs %v)", runs["order-7"], runs)
			}
			if kind == "reducer" {
				if got := e.stateOf(key); got != "2" {
					t.Fatalf("the key's counter is %q after the holding job and order-7, want 2", got)
				}
			}
		})
	}
}

// outcomeTable is a database's outcomes table in memory, as keylanepg's
// keylane_outcomes: a job whose ID it records is done with the recorded
// result; a group's new rows commit together, and two rows of one ID in
// one transaction break its unique key, failing the whole call.
type outcomeTable struct {
	mu   sync.Mutex
	rows map[string][]byte
	run  func(Job)
}

func (db *outcomeTable) ApplyGroup(_ context.Context, g JobGroup) ([]JobOutcome, error) {
	out := make([]JobOutcome, len(g.Jobs))
	fresh := map[string][]byte{}
	for i, j := range g.Jobs {
		db.mu.Lock()
		res, done := db.rows[j.ID]
		db.mu.Unlock()
		if done {
			out[i] = JobOutcome{Result: res, Done: true}
			continue
		}
		if _, twice := fresh[j.ID]; twice {
			return nil, errors.New("duplicate key value violates unique constraint \"keylane_outcomes_pkey\"")
		}
		db.run(j)
		fresh[j.ID] = []byte("done " + j.ID)
		out[i] = JobOutcome{Result: fresh[j.ID], Done: true}
	}
	db.mu.Lock()
	maps.Copy(db.rows, fresh)
	db.mu.Unlock()
	return out, nil
}

// TestRetryOfABatchedCallBeforeItsBatchResentRunsOnce is the issue's "a job
// runs twice": a batched Call whose first publish was lost ends with a
// no-reply error naming <batch>.0; its caller calls again WithID that ID,
// which is stored and runs; then the batcher's resend of the batch is
// stored too (the server de-duplicates the batch's ID only). The resend
// carries Keylane-Idempotent (publish marks every copy after the first),
// so the worker looks every job of it up by ID before running it, and a
// plain Handler answers the job from the retry's kept outcome. Before,
// only the jobs' own idempotent flag counted, and the job ran twice.
func TestRetryOfABatchedCallBeforeItsBatchResentRunsOnce(t *testing.T) {
	const prefix = "rp.test."
	e := newEnv(t, TopologyConfig{Partitions: 1, ReplyPrefix: prefix})
	var mu sync.Mutex
	runs := map[string]int{}
	e.waitOwned(e.worker("w", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		runs[j.ID]++
		return []byte("sold to " + j.ID), nil
	}), nil))
	batchID := testBatchID("lostfirstpublish")
	id := wire.BatchedJobID(batchID, 0)
	// The caller's retry by the ID its no-reply error named.
	res, err := e.client.Call(ctx(t), "seat:9", []byte("buy"), WithID(id))
	if err != nil || string(res) != "sold to "+id {
		t.Fatalf("retried Call = %q, %v", res, err)
	}
	// The batcher's resend of the original batch, stored after it.
	replies, err := e.nc.SubscribeSync(prefix + "orig.>")
	if err != nil {
		t.Fatal(err)
	}
	body, err := wire.EncodeBatch([]wire.BatchJob{{Key: "seat:9", ID: id, Reply: prefix + "orig.-1", KeepOutcome: true, Payload: []byte("buy")}})
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: wire.BatchSubject(e.ns, 0), Data: body, Header: nats.Header{
		HeaderJobID: {batchID}, wire.HeaderBatch: {"1"}, HeaderPartitions: {"1"}, wire.HeaderBatchJobs: {"1"},
		HeaderIdempotent: {"1"}, // a copy after the first (Client.publish)
	}}
	if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	reply, err := replies.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("the resent batch's Call got no reply: %v", err)
	}
	if got, err := decodeReply(reply); err != nil || string(got) != "sold to "+id {
		t.Fatalf("the resent batch's Call was answered %q, %v; want the retry's outcome", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs[id] != 1 {
		t.Fatalf("job %s ran %d times, want once", id, runs[id])
	}
}
