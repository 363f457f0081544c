package tenure

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"

	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// finish stores the result, replies and acks, all only while the lease is
// trusted. It reports whether it acked.
func (o *Owner) finish(t *task, res []byte, herr error, dead bool) (acked bool) {
	defer traceOf(t.job).finish(t.job, herr, dead).end(&acked) // starts the commit span now
	if dead && t.batch != nil {
		t.deadInBatch = true
	}
	// Each step that others see is preceded by its own trust check (a
	// clock read, a system call on Linux: one per step, not more).
	if !t.outcomeKept {
		if !o.l.Trusted() {
			o.stats.Unacked.Add(1)
			return false
		}
		// Kept before the reply and the ack: a retry by ID must find it.
		if !o.keepEncoded([]*task{t}, func(int) []byte { return encodeResult(res, herr, dead) }) {
			o.stats.Unacked.Add(1)
			return false
		}
	}
	if t.keptInBatch {
		// Kept with its batch's, before the batch's ack.
		t.batch.record(t.job.Index(), t.job.ID, encodeResult(res, herr, dead))
	}
	if reply := t.msg.Headers().Get(wire.HeaderReply); reply != "" && !t.replied {
		m := replyMsg(reply, res, herr, dead)
		if !o.l.Trusted() {
			o.stats.Unacked.Add(1)
			return false
		}
		if err := o.nc.PublishMsg(m); err != nil {
			o.log.Warn("reply", "job_id", t.job.ID, "err", err)
		}
	}
	if !o.l.Trusted() {
		o.stats.Unacked.Add(1)
		return false
	}
	if err := t.msg.Ack(); err != nil {
		o.stats.Unacked.Add(1)
		o.log.Warn("ack", "job_id", t.job.ID, "err", err)
		return false
	}
	o.observeSettled(t)
	o.logAcked(t)
	if t.maybeDup {
		o.forgetStarts(t.job.ID)
	}
	for {
		cur := o.maxAcked.Load()
		if t.job.Seq <= cur || o.maxAcked.CompareAndSwap(cur, t.job.Seq) {
			break
		}
	}
	return true
}

// Dead letters always fit and are always stored: the error text is cut to
// deadErrorMax bytes, a dead letter's headers are built from the job's
// fields that passed package wire's rules and the submitter's allowed
// headers (never a received Nats-* or Keylane-* header, which the
// dead-letter stream would refuse for ever), and a dead letter that would
// still exceed the server's max_payload (a job published near the limit
// by something other than Client, which leaves DeadLetterReserve free)
// drops the payload, saying how long it was, then the submitter's headers.
const (
	deadErrorMax = wire.DeadErrorMax
	// DeadLetterReserve is the room Client leaves below max_payload in every
	// job for what a dead letter adds (keylane.DeadLetterReserve) (headers naming the error, attempts,
	// worker, sequence, partition and fence).
	DeadLetterReserve = 2048
)

// deadLetter stores the job, with why it failed, on the dead-letter stream.
// A failed write is retried with backoff for as long as the lease is
// trusted, and counted and logged: the lane never moves past a job that
// was neither applied nor dead-lettered. A write the stream refuses for
// good (a 400 answer: a header it does not take, a message above its
// limits; or max_payload) is not sent again as it was: it is sent once
// more bare (our headers only, no payload, no submitter's headers), and a
// bare dead letter still refused says the dead-letter stream's own
// configuration refuses what every dead letter is; that is logged at ERROR
// as an operator's to fix and retried with backoff, holding the lane as a
// missing stream does. It reports whether the dead letter was stored (only
// then may the job be acked); false means the tenure ended first and the
// job goes to the next owner.
func (o *Owner) deadLetter(msg deadSource, job core.Job, why error, attempts int) bool {
	dm := o.deadMessage(msg, job, why, attempts, false)
	bare := false
	for try := 1; ; try++ {
		if !o.l.Trusted() || o.ctx.Err() != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(o.ctx, deadLetterTimeout)
		_, err := o.js.PublishMsg(ctx, dm)
		cancel()
		err = natserr.Once(err)
		if err == nil {
			break
		}
		o.stats.DeadErrors.Add(1)
		switch {
		case refusedForGood(err) && !bare:
			o.log.Error("dead letter refused; storing it bare (no payload, no submitter's headers)", "job_id", job.ID, "err", err)
			dm, bare = o.deadMessage(msg, job, why, attempts, true), true
			continue
		case refusedForGood(err):
			o.log.Error("the dead-letter stream refuses even a bare dead letter: its configuration must be fixed; the job stays in its lane until then", "job_id", job.ID, "try", try, "err", err)
		default:
			o.log.Error("dead-letter write failed; the job stays in its lane until one succeeds", "job_id", job.ID, "try", try, "err", err)
		}
		timer := time.NewTimer(o.cfg.Backoff(try))
		select {
		case <-timer.C:
		case <-o.ctx.Done():
			timer.Stop()
			return false
		}
	}
	o.stats.Dead.Add(1)
	o.log.Warn("job dead-lettered", "job_id", job.ID, "seq", job.Seq, "attempts", attempts, "err", why)
	return true
}

// refusedForGood reports whether a publish was refused for what the
// message is, so sending it again as it is cannot succeed: the stream
// answered 400 (a header it does not take, such as Nats-Batch-* or
// Nats-Schedule*, a message above its size limit), or nats.go refused it
// (max_payload, a header name it cannot send).
func refusedForGood(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code == 400 ||
		errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg)
}

// deadLetterTimeout bounds one write to the dead-letter stream.
const deadLetterTimeout = 5 * time.Second

// deadMessage builds the dead letter of msg (wire.DeadHeader): the job's
// fields that pass wire's rules, the submitter's allowed headers and why
// it failed, bounded to fit the server's max_payload. A bare one carries
// neither payload nor the submitter's headers.
func (o *Owner) deadMessage(msg deadSource, job core.Job, why error, attempts int, bare bool) *nats.Msg {
	f, _ := o.rules().Parse(msg.Subject(), msg.Headers())
	d := wire.Dead{ID: wire.BatchDeadID(o.topo.EpochOf(o.p), job.Seq, job.Index()), Error: why.Error(), Attempts: attempts, Worker: o.cfg.WorkerID, Seq: job.Seq, Partition: o.p, Fence: o.l.Fence()}
	user := msg.Headers()
	dm := nats.NewMsg(partition.DeadSubject(o.topo.Names.Namespace, o.p))
	dm.Data = msg.Data()
	if bare {
		user, d.PayloadDropped, dm.Data = nil, len(dm.Data), nil
	}
	dm.Header = wire.DeadHeader(f, user, d)
	if size := messageSize(dm); size > o.nc.MaxPayload() {
		d.PayloadDropped, dm.Data = len(dm.Data), nil
		dm.Header = wire.DeadHeader(f, user, d)
		// Headers of a foreign message may be huge too: keep ours only.
		if messageSize(dm) > o.nc.MaxPayload() {
			dm.Header = wire.DeadHeader(f, nil, d)
		}
	}
	return dm
}

// messageSize is roughly what a message takes against max_payload.
var messageSize = core.MessageSize

// storedResult looks up the outcome kept under a job ID, with a get the
// results stream's leader answers (leaderGet): a replica's direct get may
// not have applied an outcome a previous owner kept moments ago, and
// "none kept" runs the job. Only "no such key" means none: a look-up that
// fails (no leader, a cut connection) is tried again with backoff while
// the tenure lasts, for running the job on a failed look-up would run
// again a job that finished (a paid order's side effect, for a Handler).
// It reports false also when the tenure ended first; the caller then must
// not run the job (o.ctx is done). A kept outcome that exists but cannot
// be read (a garbled batch entry: batchStoredResult) is reported found,
// its error an *unreadableOutcomeError, which replay dead-letters. in is
// the batch message the job came in (nil for a lone one): a redelivered
// batch's entry is read once for its jobs.
func (o *Owner) storedResult(id string, in *batchMsg) ([]byte, error, bool) {
	if wire.ValidateJobID(id) != nil {
		return nil, nil, false
	}
	stream, subject := "KV_"+o.topo.Names.Results(), "$KV."+o.topo.Names.Results()+"."+id
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(o.ctx, core.ResultLookupTimeout)
		sm, err := leaderGet(ctx, o.nc, stream, subject)
		cancel()
		if err == nil {
			if k := keptValue(id, sm.Header, sm.Data); k != nil {
				return k.res, k.err, true
			}
			err = errNoEntry
		}
		if errors.Is(err, errNoEntry) {
			// None by ID: a batched Call's is kept in its batch's entry.
			ctx, cancel := context.WithTimeout(o.ctx, core.ResultLookupTimeout)
			v, found, berr := o.batchStoredResult(ctx, id, in)
			cancel()
			var bad *unreadableOutcomeError
			switch {
			case berr == nil && !found:
				return nil, nil, false
			case berr == nil:
				if res, rerr, ok := core.DecodeOutcome(v); ok {
					return res, rerr, true
				}
				return nil, &unreadableOutcomeError{ID: id, Err: errors.New("its batch's entry holds an outcome that does not decode")}, true
			case errors.As(berr, &bad):
				return nil, bad, true
			}
			err = berr
		}
		o.log.Warn("kept outcome look-up failed; trying again", "job_id", id, "try", try, "err", err)
		t := time.NewTimer(o.cfg.Backoff(try))
		select {
		case <-t.C:
		case <-o.ctx.Done():
			t.Stop()
			return nil, nil, false
		}
	}
}

// replay answers t from an outcome kept by an earlier run: stored already,
// and a dead letter's outcome stays a dead letter's. One that cannot be
// read (an *unreadableOutcomeError from storedResult) dead-letters t.
func (o *Owner) replay(t *task, res []byte, rerr error) {
	if bad, ok := rerr.(*unreadableOutcomeError); ok {
		o.deadLetterUnreadable(t, bad)
		return
	}
	o.stats.FromResults.Add(1)
	t.outcomeKept = true
	var re *core.RemoteError
	o.finish(t, res, rerr, errors.As(rerr, &re) && re.DeadLettered)
}

// firstKept looks up, in one batched request (then concurrently per ID for
// what it did not settle), the kept outcomes of the tasks whose ID
// the caller chose, and returns the index of the first task that has one
// (an earlier run of the same job ID finished), or -1.
func (o *Owner) firstKept(ts []*task) int {
	o.lookUpKeptBatch(ts) // one request; what it leaves unsettled is looked up per ID
	var wg sync.WaitGroup
	for _, t := range ts {
		if t.explicit && !t.lookedUp && t.kept == nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if res, rerr, ok := o.storedResult(t.job.ID, t.batch); ok {
					t.kept = &keptOutcome{res: res, err: rerr}
				} else {
					t.lookedUp = true
				}
			}()
		}
	}
	wg.Wait()
	for i, t := range ts {
		if t.kept != nil {
			return i
		}
	}
	return -1
}

// keepOutcomes stores, before anything is replied or acked, the outcomes of
// the settled tasks that need it (all with StoreResults, else those with a
// caller's ID or from a Call), as concurrent publishes to the results
// bucket waited on together. A failed batch (the bucket electing a leader)
// is tried again with backoff while the lease is trusted: the jobs are
// applied, and their callers wait for these outcomes. It reports false only
// when the tenure ended first; the jobs then stay unacked and are answered
// from the state entry when redelivered.
func (o *Owner) keepOutcomes(ts []*task, out [][]byte) bool {
	return o.keepEncoded(ts, func(i int) []byte { return encodeResult(out[i], nil, false) })
}

// keepEncoded is keepOutcomes with each task's outcome already encoded.
func (o *Owner) keepEncoded(ts []*task, value func(i int) []byte) bool {
	var idx []int
	for i, t := range ts {
		if o.cfg.StoreResults || t.explicit || t.keep && !t.keptInBatch || t.redriveOf != "" || t.deadInBatch {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return true
	}
	subject := "$KV." + o.topo.Names.Results() + "."
	for try := 1; ; try++ {
		if err := o.publishOutcomes(subject, ts, value, idx); err == nil {
			for _, i := range idx {
				ts[i].outcomeKept = true
			}
			return true
		} else {
			o.log.Warn("store results; trying again", "jobs", len(idx), "try", try, "err", err)
		}
		timer := time.NewTimer(o.cfg.Backoff(try))
		select {
		case <-timer.C:
		case <-o.ctx.Done():
			timer.Stop()
			return false
		}
		if !o.l.Trusted() {
			return false
		}
	}
}

// publishOutcomes stores the outcomes of ts[idx] (a redriven job's under
// both IDs, when its redrive ticket says so: checkRedrive), with those of
// the groups of other lanes that keep meanwhile, as one atomic batch where
// outcomes go so, or else as asynchronous publishes, and waits for every
// ack.
func (o *Owner) publishOutcomes(subject string, ts []*task, value func(i int) []byte, idx []int) error {
	for _, i := range idx {
		if err := o.checkRedrive(ts[i]); err != nil {
			return err
		}
	}
	puts := make([]kvPut, 0, len(idx))
	for _, i := range idx {
		v := value(i)
		puts = append(puts, kvPut{Subject: subject + ts[i].job.ID, Value: v})
		if of := ts[i].redriveOf; of != "" {
			puts = append(puts, kvPut{Subject: subject + of, Value: v})
		}
	}
	// With the groups of the partition's other lanes that keep meanwhile:
	// one atomic batch where outcomes go so (kept.Store.KeepShared).
	return o.kept.KeepShared(o.ctx, puts)
}
