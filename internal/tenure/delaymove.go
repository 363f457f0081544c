package tenure

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// movesInFlight bounds the delayed jobs' submissions one owner moves at
// once; the fetch loop waits for room beyond it.
const movesInFlight = 8

// isSubmission reports whether subject is one of the namespace's delay
// subjects: a delayed job's submission, not a job to run.
func (o *Owner) isSubmission(subject string) bool {
	return o.topo.Meta.Delays && strings.HasPrefix(subject, o.topo.Names.Namespace+".delay.")
}

// moveDelayed takes a delayed job's submission (stored at seq in the jobs
// stream, on the partition's delay subject) out of the jobs stream: it
// checks it (wire.Rules.ParseDelayedBatch for a batch of one, the format
// clients send; wire.Rules.ParseDelayed for an earlier client's one-job
// message; a refused one is dead-lettered with
// the reason, as a malformed job is), stores its schedule in the delays
// stream (wire.Rules.Schedule, built from what passed the rules), and
// acks it. The schedule's Nats-Msg-Id is the submission's (wire.MoveID),
// and the server keeps one schedule per job ID, so a submission moved
// twice (an owner died before its ack, or a deposed owner moved it too)
// leaves one schedule. A schedule the delays stream refuses for good is a
// dead letter with that reason; any other failure is met with a
// redelivery after backoff. The move runs beside the fetch loop (at most
// movesInFlight at once): a slow delays stream does not hold the
// partition's jobs.
func (o *Owner) moveDelayed(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
	seq := meta.Sequence.Stream
	r := o.rules()
	var d wire.Delayed
	var err error
	received, data := msg.Headers(), msg.Data()
	if _, isBatch := received[wire.HeaderBatch]; !isBatch {
		// An earlier client's one-job submission, or a raw publisher's:
		// refused unrun, as any one-job message (dispatch). Nothing of its
		// headers is acted on (a delayed job has no caller waiting).
		o.refuse(msg, seq, wire.Job{}, errOneJobMessage)
		return
	}
	d, received, data, err = r.ParseDelayedBatch(msg.Subject(), msg.Headers(), msg.Data(), meta.Timestamp)
	if err != nil {
		o.malformed(msg, seq, d.Job, err)
		return
	}
	subject, h := r.Schedule(d, received, wire.MoveID(o.topo.EpochOf(o.p), seq))
	sm := &nats.Msg{Subject: subject, Header: h, Data: data}
	select {
	case o.moves <- struct{}{}:
	case <-o.ctx.Done():
		return // the next owner moves it
	}
	o.moving.Add(1)
	go func() {
		defer o.moving.Done()
		defer func() { <-o.moves }()
		if !o.l.Trusted() {
			return // the next owner moves it
		}
		ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
		_, err := o.js.PublishMsg(ctx, sm)
		cancel()
		err = natserr.Once(err)
		switch {
		case err == nil:
		case refusedForGood(err):
			o.refuse(msg, seq, d.Job, fmt.Errorf("the delays stream refused its schedule: %w", err))
			return
		default:
			o.log.Warn("delayed job not moved into the delays stream; it is delivered again", "job_id", d.ID, "seq", seq, "err", err)
			_ = msg.NakWithDelay(o.cfg.Backoff(int(meta.NumDelivered)))
			return
		}
		o.log.Debug("delayed job scheduled", "job_id", d.ID, "key", d.Key, "run_at", d.RunAt, "seq", seq)
		if err := msg.Ack(); err != nil {
			// Delivered again, it is moved again: the same schedule.
			o.log.Warn("ack of a moved delayed job", "job_id", d.ID, "seq", seq, "err", err)
		}
	}()
}

// deleteDue deletes a delayed job's due copy (at seq in the delays
// stream) once the jobs stream has sourced it and this worker received
// it: the copy has no use left. Best effort, beside the fetch loop: a copy
// left behind (a failed delete, a worker that died first) is removed by
// the delays stream's MaxAge, and a delete of one already gone is no
// harm.
func (o *Owner) deleteDue(seq uint64) {
	body, _ := json.Marshal(map[string]any{"seq": seq, "no_erase": true})
	subject := namespace.APIPrefix(o.js) + "STREAM.MSG.DELETE." + o.topo.Names.Delays()
	o.moving.Add(1)
	go func() {
		defer o.moving.Done()
		ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
		defer cancel()
		if _, err := o.nc.RequestWithContext(ctx, subject, body); err != nil && o.ctx.Err() == nil {
			o.log.Debug("due copy of a delayed job not deleted (the delays stream's MaxAge will)", "due_seq", seq, "err", err)
		}
	}()
}
