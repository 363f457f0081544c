package tenure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/kept"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// Outcomes kept per batch on the worker (see "Batches on the wire" in
// package jetstream's doc, "Outcomes."). On a namespace whose jobs have
// held outcomes (a Reducer's state entries, an Applier's database) and
// without StoreResults, the Calls of a batch message, whose IDs name their
// batch and index (wire.BatchedJobID), have their outcomes kept in one
// results entry per batch (wire.BatchOutcomesKey), written once every job
// of the batch is settled and before the batch's ack, instead of one entry
// per job before its reply. Each job's reply goes as soon as it is
// settled. A job asked for again by its ID (a retried Call) finds its
// outcome there, or in the batch still open on this owner.

// keptPerBatch reports whether this worker keeps batched Calls' outcomes
// per batch: jobs whose held outcomes answer a redelivery without running
// them (a Reducer, an Applier), and no StoreResults (which promises
// Result by ID for every job). A plain Handler's Calls keep theirs by ID:
// a retry by ID that runs before its batch is settled finds nothing else.
func (o *Owner) keptPerBatch() bool {
	return !o.cfg.StoreResults && (o.cfg.Reducer != nil || o.cfg.Applier != nil)
}

// keptInBatch reports whether job j, at index of batch b, has its outcome
// kept in b's entry: a Call (kept, answered), not a retry by ID, whose ID
// is the one its batch and index name.
func (o *Owner) keptInBatch(b *batchMsg, j wire.Job, index int) bool {
	return o.keptPerBatch() && wire.ValidBatchID(b.id) && j.KeepOutcome && !j.Idempotent && j.Reply != "" &&
		j.ID == wire.BatchedJobID(b.id, index)
}

// record notes job id's encoded outcome at index, for the batch's entry;
// a job settled again (a replay) replaces its earlier one.
func (b *batchMsg) record(index int, id string, value []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.outs {
		if b.outs[i].Index == index {
			b.outs[i] = wire.BatchOutcome{Index: index, ID: id, Value: value}
			return
		}
	}
	b.outs = append(b.outs, wire.BatchOutcome{Index: index, ID: id, Value: value})
}

// recorded returns the outcome recorded at index for job id, if any.
func (b *batchMsg) recorded(index int, id string) ([]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.outs {
		if o.Index == index && o.ID == id {
			return o.Value, true
		}
	}
	return nil, false
}

// openBatches are the batches of an owner whose entries are not written
// yet, by batch ID: a retry by ID of one of their Calls is answered from
// them.
type openBatches struct {
	mu sync.Mutex
	m  map[string]*batchMsg
}

// add holds b open, unless a copy of it is open already (a redelivery
// racing the original here: the original's jobs settle both).
func (ob *openBatches) add(b *batchMsg) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.m == nil {
		ob.m = map[string]*batchMsg{}
	}
	if ob.m[b.id] == nil {
		ob.m[b.id] = b
	}
}

func (ob *openBatches) remove(b *batchMsg) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.m[b.id] == b {
		delete(ob.m, b.id)
	}
}

func (ob *openBatches) get(id string) *batchMsg {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.m[id]
}

// keepBatch returns what writes batch b's entry before its ack: the
// outcomes recorded, in one results entry, tried again with backoff while
// the lease is trusted (its Calls were answered; a lost reply is
// recovered from it). An error (the tenure ended) leaves the batch
// unacked: redelivered, its jobs are answered from their held outcomes
// and the entry is written then.
func (o *Owner) keepBatch(b *batchMsg) func() error {
	return func() error {
		defer o.open.remove(b)
		if c := b.claim; c != nil && c.refused {
			return nil // another message's ID: nothing ran, nothing is kept (claimBatchID)
		}
		b.mu.Lock()
		outs := slices.Clone(b.outs)
		b.mu.Unlock()
		if len(outs) == 0 {
			return nil
		}
		slices.SortFunc(outs, func(x, y wire.BatchOutcome) int { return x.Index - y.Index })
		v, err := wire.EncodeBatchOutcomes(b.id, outs)
		if err == nil && len(v) > int(o.nc.MaxPayload())-1024 {
			err = fmt.Errorf("entry of %d bytes, over max_payload %d less headers", len(v), o.nc.MaxPayload())
		}
		// A permanent refusal is never retried (it would hold the batch
		// unacked for good, redelivered and refused again): the outcomes
		// are kept one entry per job ID instead, where the client's
		// recovery and a look-up by ID find them too.
		byID := func(why error) []kvPut {
			o.log.Warn("batch outcomes cannot be one entry; kept by job ID", "batch", b.id, "jobs", len(outs), "err", why)
			puts := make([]kvPut, len(outs))
			for i, out := range outs {
				puts[i] = kvPut{Subject: o.kept.Subject(out.ID), Value: out.Value}
			}
			return puts
		}
		perID := err != nil
		var puts []kvPut
		if perID {
			puts = byID(err)
		}
		for try := 1; ; try++ {
			if !o.l.Trusted() {
				return errTenureEnded
			}
			var err error
			if perID {
				err = o.kept.PutEach(o.ctx, puts)
			} else {
				err = o.putBatchEntry(b, v)
			}
			if errors.Is(err, errBatchIDTaken) {
				// Never written over: the jobs ran and were answered,
				// their outcomes are not kept (claimBatchID refuses such
				// a batch on receipt; only a race with the entry's first
				// write gets here).
				o.log.Error("batch outcomes not kept: the batch ID's entry belongs to another message", "batch", b.id, "origin", b.origin, "err", err)
				return nil
			}
			if err == nil {
				if !o.l.Trusted() {
					return errTenureEnded
				}
				return nil
			}
			if refusedForGood(err) {
				if perID {
					// An outcome alone over the limit: say so; the batch
					// stays unacked rather than acked without its outcomes.
					o.log.Error("batch outcomes refused for good, one by one too; the batch stays unacked", "batch", b.id, "err", err)
					return err
				}
				perID, puts = true, byID(err)
				continue
			}
			o.log.Warn("store batch outcomes; trying again", "batch", b.id, "jobs", len(outs), "try", try, "err", err)
			timer := time.NewTimer(o.cfg.Backoff(try))
			select {
			case <-timer.C:
			case <-o.ctx.Done():
				timer.Stop()
				return errTenureEnded
			}
		}
	}
}

var (
	errBatchIDTaken = kept.ErrBatchIDTaken
	batchOrigin     = kept.BatchOrigin
)

// claimBatchID checks, on receipt, that batch b (message msg, jobs es)
// may keep its outcomes under its ID, on a worker that keeps them per
// batch: no batch of its ID open on this owner but a copy of this
// message, and its entry, if any, this message's. It notes b's origin,
// holds b open, and reads the entry off the fetch loop: b.claim is done
// when the read answered, and no job of b runs before (gateClaims). A
// batch whose ID is another message's is
// refused whole (refuseTakenBatch), now when a batch of its ID is open
// here (false returned), or once the read finds the entry another
// message's (b.claim refused). A failed read refuses nothing: the write's
// compare then decides (never over another message's entry).
//
// The decisions are those the read made on the fetch loop would give, in
// the same order: a message of an ID whose claim is still read waits for
// that claim to end before its own is decided (a forgery first must not
// refuse the honest message after it, nor be taken for it), and a copy of
// this very message (a redelivery racing the original) shares its claim.
// The entry is written only after every job of b settled, long after the
// read, so reading it a moment later than receipt changes nothing.
func (o *Owner) claimBatchID(msg jetstream.Msg, meta *jetstream.MsgMetadata, es []wire.BatchEntry, b *batchMsg) bool {
	if !o.keptPerBatch() || !wire.ValidBatchID(b.id) {
		return true
	}
	// A batch none of whose jobs keeps its outcome in the entry writes no
	// entry, so it can overwrite none: no read (a batch of Submits, or of
	// jobs with a caller's ID, kept by ID).
	keeps := false
	for i, e := range es {
		if e.Err == nil && o.keptInBatch(b, e.Job, i) {
			keeps = true
			break
		}
	}
	if !keeps {
		return true
	}
	seq := meta.Sequence.Stream
	b.origin = batchOrigin(meta.Stream, o.topo.EpochOf(o.p), seq)
	for {
		open := o.open.get(b.id)
		if open == nil {
			break
		}
		if open.origin == b.origin {
			b.claim = open.claim // a redelivery racing the original here
			return true
		}
		if c := open.claim; c != nil && !c.ended() {
			// Another message of this ID, still being claimed: its read
			// decides first (rare: one of the two is a forgery).
			if !c.wait(o.ctx) {
				return false // the tenure ended: unacked, for the next owner
			}
			continue
		}
		o.refuseTakenBatch(msg, seq, es, fmt.Errorf("%w: batch %s is open here for message %q, this is %q", errBatchIDTaken, b.id, open.origin, b.origin), true)
		return false
	}
	c := &batchClaim{done: make(chan struct{})}
	b.claim = c
	o.open.add(b) // before the read: a later message of its ID waits for this claim
	o.moving.Add(1)
	go func() {
		defer o.moving.Done()
		defer close(c.done)
		ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
		defer cancel()
		rev, takenBy, err := o.kept.EntryRev(ctx, b.id, b.origin)
		switch {
		case err != nil:
			if o.ctx.Err() == nil {
				o.log.Warn("read of a batch's entry on receipt failed; its write will check it", "batch", b.id, "err", err)
			}
			return
		case takenBy == "":
			if rev != 0 {
				b.entryRev = rev
			}
			return
		}
		// Refused: no job of b runs, and its entry is not written
		// (keepBatch); its jobs are settled unrun (gateClaims) once the
		// message is dead-lettered, the last acking it. A message handed
		// back meanwhile is refused on its redelivery instead.
		o.open.remove(b)
		c.refused = true
		if c.abandoned.Load() {
			return
		}
		c.settle = o.refuseTakenBatch(msg, seq, es, fmt.Errorf("%w: the entry of batch %s keeps message %q's outcomes, this is %q", errBatchIDTaken, b.id, takenBy, b.origin), false)
	}()
	return true
}

// batchClaim is the check of a batch message's ID on receipt while its
// entry is read (claimBatchID). refused and settle are written before
// done is closed.
type batchClaim struct {
	done chan struct{}
	// refused: the entry is another message's; none of the batch's jobs
	// runs. settle: the message was dead-lettered and its Calls told, so
	// its jobs are settled unrun (the last acks it); else they are left
	// unacked, for the message to come again.
	refused, settle bool
	// abandoned: the message was handed back (owner.handBack) before the
	// read answered; its redelivery is claimed again, so a refusal of
	// this copy is neither dead-lettered nor answered.
	abandoned atomic.Bool
}

// ended reports whether the read answered.
func (c *batchClaim) ended() bool { return isClosed(c.done) }

// wait waits for the read's answer; false when ctx ended first.
func (c *batchClaim) wait(ctx context.Context) bool {
	select {
	case <-c.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// gateClaims wraps run so that no job of a batch message runs before its
// claim ended (claimBatchID): it waits for the claims of ts, and settles
// unrun, or leaves unacked, the jobs of a refused one. The claim's read
// was sent on receipt, so the wait is the rest of one request at most,
// and only for the key whose job comes up first.
func (o *Owner) gateClaims(run func([]*task)) func([]*task) {
	return func(ts []*task) {
		refused := false
		for _, t := range ts {
			if t.batch == nil || t.batch.claim == nil {
				continue
			}
			c := t.batch.claim
			if !c.wait(o.ctx) {
				o.stats.Unacked.Add(int64(len(ts)))
				return
			}
			refused = refused || c.refused
		}
		if refused {
			left := make([]*task, 0, len(ts))
			for _, t := range ts {
				c := (*batchClaim)(nil)
				if t.batch != nil {
					c = t.batch.claim
				}
				switch {
				case c == nil || !c.refused:
					left = append(left, t)
				case c.settle && o.ctx.Err() == nil && o.l.Trusted():
					if err := t.msg.Ack(); err != nil {
						o.stats.Unacked.Add(1)
						o.log.Warn("ack of a refused batch", "seq", t.job.Seq, "err", err)
					}
				default:
					o.stats.Unacked.Add(1)
				}
			}
			if ts = left; len(ts) == 0 {
				return
			}
		}
		run(ts)
	}
}

// refuseTakenBatch dead-letters batch message msg whole, none of its jobs
// run, and answers each of its Calls with why; with ack, it acks the
// message too (none of its jobs is in the lanes). It reports whether the
// dead letter is stored and the lease still trusted.
func (o *Owner) refuseTakenBatch(msg jetstream.Msg, seq uint64, es []wire.BatchEntry, why error, ack bool) bool {
	o.stats.Malformed.Add(1)
	err := core.Permanent(why)
	if !o.deadLetter(msg, core.Job{Seq: seq, Partition: o.p, Fence: o.l.Fence()}, err, 0) || !o.l.Trusted() {
		return false
	}
	for _, e := range es {
		if e.Err == nil && e.Job.Reply != "" {
			if perr := o.nc.PublishMsg(replyMsg(e.Job.Reply, nil, err, true)); perr != nil {
				o.log.Warn("reply", "seq", seq, "err", perr)
			}
		}
	}
	if !ack {
		return true
	}
	if err := msg.Ack(); err != nil {
		o.stats.Unacked.Add(1)
		o.log.Warn("ack of a refused batch", "seq", seq, "err", err)
	}
	return true
}

// putBatchEntry writes v, batch b's entry, bound to b's message, over the
// revision read on receipt only (kept.Store.PutEntry).
func (o *Owner) putBatchEntry(b *batchMsg, v []byte) error {
	rev, err := o.kept.PutEntry(o.ctx, b.id, b.origin, b.entryRev, v)
	b.entryRev = rev
	return err
}

// errTenureEnded: the lease is no longer trusted, nothing more is acked.
var errTenureEnded = errors.New("keylane: tenure ended")

// batchStoredResult looks up job id, which names a batch and an index
// (wire.BatchedJobID), in that batch: open on this owner, or in its entry,
// read from the results stream's leader (once for the jobs of batch
// message in, when id is one of them: batchEntry). found is false when
// neither holds it (no entry, or the batch's entry without an outcome at
// that index: a job of the batch that keeps none in it). err is an
// *unreadableOutcomeError when the entry is garbled or not this job's
// (another batch's, another job at the index): never legit, for only
// workers write it; it is never read as this job's outcome, nor as none
// kept (that would run again a job that finished). Any other err: the
// look-up failed (try again).
func (o *Owner) batchStoredResult(ctx context.Context, id string, in *batchMsg) (value []byte, found bool, err error) {
	batchID, index, ok := wire.ParseBatchedJobID(id)
	if !ok {
		return nil, false, nil
	}
	open := o.open.get(batchID)
	if open != nil {
		if v, ok := open.recorded(index, id); ok {
			return v, true, nil
		}
	}
	var e *batchEntryRead
	if in != nil && in.id == batchID && in.keep == nil && open == nil {
		e, err = o.batchEntry(ctx, in)
	} else {
		e, err = o.readBatchEntry(ctx, batchID)
	}
	switch {
	case err != nil:
		return nil, false, err
	case e.data == nil:
		return nil, false, nil
	}
	v, err := wire.FindBatchOutcome(e.data, batchID, index, id)
	switch {
	case errors.Is(err, wire.ErrNoBatchOutcome):
		return nil, false, nil
	case err != nil:
		return nil, false, &unreadableOutcomeError{ID: id, Err: fmt.Errorf("its batch's entry: %w", err)}
	}
	return v, true, nil
}

// batchEntryRead is a batch's entry as the results stream's leader held
// it: data nil when it had none (never written, expired, removed).
type batchEntryRead struct{ data []byte }

// readBatchEntry reads batch batchID's entry from the results stream's
// leader; an error means the read failed (try again).
func (o *Owner) readBatchEntry(ctx context.Context, batchID string) (*batchEntryRead, error) {
	data, err := o.kept.ReadEntry(ctx, batchID)
	if err != nil {
		return nil, err
	}
	return &batchEntryRead{data: data}, nil
}

// batchEntry is readBatchEntry once for the jobs of batch message b (a
// redelivered batch's, each looked up by ID: one leader get for the
// batch, not one per job). Only for a batch whose entry this tenure never
// writes (b keeps none of its outcomes in it, and no batch of its ID is
// open here): every outcome in it was kept by an earlier owner, whose
// lease ended before this tenure began, so what the leader held at the
// first read is what it holds for the batch's life. A failed read is
// not kept: the next look-up reads again.
func (o *Owner) batchEntry(ctx context.Context, b *batchMsg) (*batchEntryRead, error) {
	b.entryMu.Lock()
	defer b.entryMu.Unlock()
	if b.entry != nil {
		return b.entry, nil
	}
	e, err := o.readBatchEntry(ctx, b.id)
	if err != nil {
		return nil, err
	}
	b.entry = e
	return e, nil
}

// deadLetterUnreadable dead-letters t, whose kept outcome is unreadable
// (bad), without running it, and answers its caller so: permanent, for
// trying again cannot cure the entry.
func (o *Owner) deadLetterUnreadable(t *task, bad *unreadableOutcomeError) {
	o.stats.Failed.Add(1)
	o.log.Error("kept outcome unreadable; dead-lettering the job instead of running it again", "job_id", t.job.ID, "seq", t.job.Seq, "err", bad)
	err := core.Permanent(bad)
	if o.deadLetter(t.msg, t.job, err, t.job.Attempt) {
		o.finish(t, nil, err, true)
	}
}
