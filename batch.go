package keylane

import (
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// Atomic batches on the client (ClientConfig.AtomicBatches). Not to be
// confused with the worker's group commit (State.group: one state write
// for a run of one key's jobs).
//
// On a server that fsyncs every write (sync_interval: always), each plain
// publish waits for its own fsync, so concurrent submitters queue behind
// each other's disk writes. The batcher coalesces them: while a batch is in
// flight, new jobs queue; when its ack comes, everything queued goes out as
// one JetStream atomic batch (server 2.12 and later), which the server
// stores with one fsync. Under load the batch grows by itself; alone, a job
// goes out at once.
//
// Every job carries its ID as Nats-Msg-Id, so resending is safe: when a
// batch fails or its ack does not come, its jobs are resent one by one, each
// with its own ack, and only a job that is itself refused gets an error.

const (
	batchMax      = 1000 // the server's default largest atomic batch
	batchInflight = 4    // batches in flight per client (the server allows 50 per stream)
	batchTimeout  = 5 * time.Second
)

type batchJob struct {
	m     *nats.Msg
	token string // the waiter told of the outcome
}

type batcher struct {
	c        *Client
	mu       sync.Mutex
	queue    []batchJob
	inflight int
	batches  map[string]*sentBatch
	sent     int // batches of more than one job sent, for tests
	resent   int // batches settled by resending their jobs one by one
}

type sentBatch struct {
	jobs  []batchJob
	timer *time.Timer
}

func newBatcher(c *Client) *batcher {
	return &batcher{c: c, batches: map[string]*sentBatch{}}
}

// publish queues m (a job message whose stream ack must reach the waiter
// token) and sends a batch if fewer than batchInflight are in flight.
func (b *batcher) publish(m *nats.Msg, token string) {
	// The batcher sets and clears batch headers and the reply on its own
	// copy: the caller's message is read without b.mu (Call clones it to
	// publish again), and a copy taken mid-batch must not carry a stale
	// Nats-Batch-Id into a publish of its own.
	m = &nats.Msg{Subject: m.Subject, Reply: m.Reply, Header: maps.Clone(m.Header), Data: m.Data}
	b.mu.Lock()
	b.queue = append(b.queue, batchJob{m, token})
	b.sendLocked()
	b.mu.Unlock()
}

// sendLocked sends the queue as a batch if the in-flight bound allows.
func (b *batcher) sendLocked() {
	if len(b.queue) == 0 || b.inflight >= batchInflight {
		return
	}
	n := min(len(b.queue), batchMax)
	jobs := append([]batchJob(nil), b.queue[:n]...)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	id := nuid.Next()
	sb := &sentBatch{jobs: jobs}
	b.batches[id] = sb
	b.inflight++
	sb.timer = time.AfterFunc(batchTimeout, func() { b.done(id, nil) })
	reply := b.c.inbox + ackPrefix + batchPrefix + id
	if len(jobs) == 1 {
		// Alone: a plain publish, acked to the batch inbox.
		m := jobs[0].m
		m.Reply = reply
		if err := b.c.nc.PublishMsg(m); err != nil {
			go b.done(id, nil)
		}
		return
	}
	b.sent++
	for i, j := range jobs {
		m := j.m
		last := i == len(jobs)-1
		markBatch(m, id, i+1, last)
		m.Reply = ""
		if last {
			m.Reply = reply
		}
		if err := b.c.nc.PublishMsg(m); err != nil {
			go b.done(id, nil)
			return
		}
	}
}

const batchPrefix = "_" // after ackPrefix; job tokens are base 36

// done settles a batch on its ack (m), or on a timeout or send failure
// (m == nil): a good ack is passed to every job's waiter; otherwise the
// jobs are resent one by one with their own acks.
func (b *batcher) done(id string, m *nats.Msg) {
	b.mu.Lock()
	sb := b.batches[id]
	if sb == nil { // already settled (a late ack after a timeout)
		b.mu.Unlock()
		return
	}
	delete(b.batches, id)
	b.inflight--
	sb.timer.Stop()
	b.sendLocked()
	b.mu.Unlock()

	// A batch's commit ack must name the batch: a server before 2.12
	// ignores the batch headers, stores the earlier jobs unacknowledged
	// and acks the last one alone, and any of them may have been refused.
	var stored error
	if m != nil && len(sb.jobs) > 1 {
		stored = batchStored(m, id, len(sb.jobs))
	}
	ok := m != nil && (len(sb.jobs) == 1 && ackOK(m) || len(sb.jobs) > 1 && stored == nil)
	if ok || (m != nil && len(sb.jobs) == 1) {
		for _, j := range sb.jobs {
			b.c.deliverTo(j.token, &nats.Msg{Subject: b.c.inbox + ackPrefix + j.token, Data: m.Data, Header: m.Header})
		}
		return
	}
	b.mu.Lock()
	b.resent++
	b.mu.Unlock()
	// Only a batch whose fate is unknown (no ack) or that a server before
	// 2.12 stored job by job may hold this call's own copy; a batch the
	// server refused stored nothing (it is atomic: one job whose ID was
	// stored before refuses the whole batch), so a "duplicate" answer to
	// the resend is a real one, ErrDuplicate.
	mayBeStored := m == nil || errors.Is(stored, errBatchIgnored)
	for _, j := range sb.jobs {
		if mayBeStored {
			b.c.mu.Lock()
			if w := b.c.waiters[j.token]; w != nil {
				w.resent.Store(true)
			}
			b.c.mu.Unlock()
		}
		jm := j.m
		unmarkBatch(jm)
		jm.Reply = b.c.inbox + ackPrefix + j.token
		if err := b.c.nc.PublishMsg(jm); err != nil {
			b.c.deliverTo(j.token, &nats.Msg{Subject: jm.Reply, Header: nats.Header{"Status": []string{"503"}}})
		}
	}
}

// close stops every batch's timer; their jobs' waiters end with the
// client (Client.Close).
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, sb := range b.batches {
		sb.timer.Stop()
		delete(b.batches, id)
	}
	b.queue = nil
}

// ackOK reports whether a batch ack stored the batch.
func ackOK(m *nats.Msg) bool {
	_, err := pubAckError(m)
	return err == nil
}
