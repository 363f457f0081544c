package tenure

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// The worker's backlog in jobs (Tenure.Backlog, the keylane_partition_backlog
// metric). The server's pending count at each delivery counts messages; a
// batch message of 50 jobs is 50 of them. So an owner reads, beside the fetch loop, the headers of its
// partition's batch messages not yet delivered (Keylane-Batch-Jobs, which
// ParseBatch holds to the body's count) and keeps each one's jobs less one
// until it is delivered. Each batch message is read once a tenure, by a
// next-by-subject get of the partition's batch subject (the server sends
// the body along: there is no headers-only read); at most one read runs
// at a time, at most once per batchAheadEvery, of at most batchAheadReads
// messages, and only while the pending count is above zero. A worker
// without Batches reads nothing: batches it dead-letters whole count one.

const (
	batchAheadEvery = time.Second
	// batchAheadReads: 256, as Inspect's reads of batch messages.
	batchAheadReads = 256
)

// batchesAhead is an owner's record of its partition's batch messages
// not yet delivered.
type batchesAhead struct {
	mu      sync.Mutex
	newest  uint64            // highest stream sequence delivered
	scanned uint64            // highest batch message's sequence read
	extra   map[uint64]uint64 // by stream sequence: its jobs less one
	reading bool
	last    time.Time // when the last read started
}

// noteDelivery records a delivery of stream sequence newest (the highest
// yet) with pending messages after it, and starts a read of the batch
// messages ahead when one is due.
func (o *Owner) noteDelivery(newest, pending uint64) {
	o.backlog.Store(pending)
	a := &o.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	a.newest = newest
	if pending == 0 {
		clear(a.extra) // everything stored was delivered
		return
	}
	if a.reading || time.Since(a.last) < batchAheadEvery {
		return
	}
	a.reading, a.last = true, time.Now()
	from := max(a.scanned, newest) + 1
	o.moving.Add(1)
	go func() {
		defer o.moving.Done()
		found, top := o.readBatchesAhead(from)
		a.mu.Lock()
		defer a.mu.Unlock()
		a.reading = false
		a.scanned = max(a.scanned, top)
		if a.extra == nil {
			a.extra = map[uint64]uint64{}
		}
		for seq, n := range found {
			a.extra[seq] = n
		}
		for seq := range a.extra {
			if seq <= a.newest {
				delete(a.extra, seq) // delivered meanwhile
			}
		}
	}()
}

// readBatchesAhead reads the partition's batch messages from stream
// sequence from on and returns each one's jobs less one, by sequence, and
// the highest sequence read.
func (o *Owner) readBatchesAhead(from uint64) (map[uint64]uint64, uint64) {
	ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
	defer cancel()
	s := o.topo.StreamOf(o.p)
	subject := wire.BatchSubject(o.topo.Names.Namespace, o.p)
	found := map[uint64]uint64{}
	var top uint64
	for seq := from; len(found) < batchAheadReads; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgNotFound) && o.ctx.Err() == nil {
				o.log.Debug("batch messages ahead not read (the backlog counts them as one job each)", "from_seq", seq, "err", err)
			}
			break
		}
		if m.Sequence < seq {
			break
		}
		found[m.Sequence] = 0
		if n, err := strconv.Atoi(m.Header.Get(wire.HeaderBatchJobs)); err == nil && n > 1 && n <= wire.MaxBatchJobs {
			found[m.Sequence] = uint64(n - 1)
		}
		top, seq = m.Sequence, m.Sequence+1
	}
	return found, top
}

// pendingJobs is Tenure.Backlog: the pending messages at the last
// delivery, each undelivered batch message counted as its jobs.
func (o *Owner) pendingJobs() uint64 {
	n := o.backlog.Load()
	if n == 0 {
		return 0
	}
	a := &o.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	for seq, extra := range a.extra {
		if seq > a.newest {
			n += extra
		}
	}
	return n
}
