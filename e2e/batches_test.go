package e2e

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Every job travels in a batch message (one wire path): the fault tests'
// loads mix Calls and Submits with and without a caller's ID, and each
// fails unless batch messages were published and jobs of them ran
// (batchCount.check). The hostile publisher sends hostile batch messages
// among its crafted ones (hostilePublisher.sendBatch).

// batchCount counts the batch messages published in a cluster's namespace
// (<ns>.jobs.*.batch, seen on the test's own connection: a resend counts
// again) and the jobs they carried.
type batchCount struct {
	c   *cluster
	sub *nats.Subscription

	mu         sync.Mutex
	msgs, jobs int
	bad        int // bodies that did not decode (the honest client sent them)
}

// countBatches starts counting; it stops when the test ends.
func countBatches(t *testing.T, c *cluster) *batchCount {
	t.Helper()
	bc := &batchCount{c: c}
	sub, err := c.nc.Subscribe(c.ns+".jobs.*."+wire.BatchToken, func(m *nats.Msg) {
		if id := m.Header.Get("Nats-Msg-Id"); id == "" || strings.HasPrefix(id, "hostile") { // hostileBatchID
			return // TestHostileWire's hostile publisher's: not the client's
		}
		jobs, err := wire.DecodeBatch(m.Data)
		bc.mu.Lock()
		defer bc.mu.Unlock()
		bc.msgs++
		if err != nil {
			bc.bad++
			return
		}
		bc.jobs += len(jobs)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	bc.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return bc
}

// check fails the test, when the cluster runs with batches, unless batch
// messages were published and jobs of them (index above 0) ran in the
// workers' trace runs: otherwise the test proved nothing about batches.
// Without batches none may have travelled.
func (bc *batchCount) check(t *testing.T, runs []sale.Span) {
	t.Helper()
	bc.mu.Lock()
	msgs, jobs, bad := bc.msgs, bc.jobs, bc.bad
	bc.mu.Unlock()
	inBatch := 0
	for _, r := range runs {
		if r.Index > 0 {
			inBatch++
		}
	}
	if !bc.c.batches() {
		if msgs > 0 || inBatch > 0 {
			t.Errorf("batches off, yet %d batch messages were published and %d runs were of jobs in a batch", msgs, inBatch)
		}
		return
	}
	t.Logf("batches: %d batch messages of %d jobs published; %d runs of jobs at index > 0 of a batch", msgs, jobs, inBatch)
	if bad > 0 {
		t.Errorf("%d batch messages the honest client published did not decode", bad)
	}
	if msgs == 0 || inBatch == 0 {
		t.Errorf("batches on, but %d batch messages were published and %d runs were of jobs in a batch: the test proved nothing about batches", msgs, inBatch)
	}
}

// TestBatchJobForgingAnHonestID: a publisher with a client's rights sends
// a batch whose job names an ID an honest caller will use, with the
// keep-outcome flag and a payload its handler refuses. The honest Submit
// of the ID comes next, within the server's duplicate window. With a
// one-job forgery (Nats-Msg-Id) the server drops the honest publish and
// Submit says ErrDuplicate: the caller is told. A batch's jobs have no
// Nats-Msg-Id of their own, so the honest job is stored and Submit
// succeeds; it must then be applied, not answered from the forged
// outcome. It failed so before a batch's job IDs were bound to the batch
// (wire.Rules.ParseBatch): "the honest Submit of victim-1 returned nil,
// yet stock is 10 after its "restock 5" on 10, want 15". Now the forged
// job is refused for its ID, and its dead letter does not name it.
func TestBatchJobForgingAnHonestID(t *testing.T) {
	c := startCluster(t, "e2e-forge-batches", 1)
	const key, victim = "forge:0", "victim-1"
	const forgedBatch = "HostileBatch0000000001" // a batch ID's shape: only its job IDs are forged
	if res := c.mustCall(key, "set 10"); res != "ok 10" {
		t.Fatalf("set: %q", res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body, err := wire.EncodeBatch([]wire.BatchJob{
		{Key: key, ID: victim, KeepOutcome: true, Payload: []byte("hostile forgery")},
		{Key: key, ID: wire.BatchedJobID(forgedBatch, 1), Payload: []byte("hostile")},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(wire.BatchSubject(c.ns, partition.Of(key, partitions)))
	m.Data = body
	m.Header["Nats-Msg-Id"] = []string{forgedBatch}
	m.Header[wire.HeaderBatch] = []string{"1"}
	m.Header[wire.HeaderBatchJobs] = []string{"2"}
	m.Header[keylane.HeaderPartitions] = []string{strconv.Itoa(partitions)}
	if _, err := c.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	c.waitDeadLetter(20*time.Second, victim, func(m *jetstream.RawStreamMsg) bool {
		if wire.JobIDOfDead(m.Header) == victim {
			t.Fatalf("the forged job's dead letter names %s: %v", victim, m.Header)
		}
		return strings.Contains(m.Header.Get(wire.HeaderError), `job ID "`+victim+`" in a batch`)
	})

	_, err = c.client.Submit(ctx, key, []byte("restock 5"), keylane.WithID(victim))
	switch {
	case errors.Is(err, keylane.ErrDuplicate):
		t.Logf("honest Submit told: %v", err)
		return
	case err != nil:
		t.Fatalf("honest Submit: %v", err)
	}
	c.waitJobsEmpty(20 * time.Second)
	if got := c.stock(key); got != 15 {
		t.Errorf("the honest Submit of %s returned nil, yet stock is %d after its \"restock 5\" on 10, want 15: it was answered from the forged job's outcome", victim, got)
	}
}
