package tenure

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/kept"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Test hooks: what package keylane's tests, which run Workers, reach in
// a tenure for (as internal/client's testhooks.go). Nothing else calls
// them.

// NewForTest returns an Owner of cfg that no balancer runs, with no
// lease (cfg.Lease is ignored): enough for the helpers below, which call
// what a tenure calls on its jobs' behalf, under ctx.
func NewForTest(ctx context.Context, cfg Config) *Owner {
	o := &Owner{
		cfg: cfg, p: cfg.Partition, stats: cfg.Stats, ctx: ctx, cancel: func() {},
		topo: cfg.Topology, nc: cfg.NC, js: cfg.JS, state: cfg.State, tracing: (*workerTracing)(cfg.Tracing),
	}
	if o.stats == nil {
		o.stats = new(Stats)
	}
	o.log = cfg.Log
	if o.log == nil {
		o.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Topology != nil {
		o.kept = kept.New(kept.Config{
			NC: cfg.NC, JS: cfg.JS, Results: cfg.Topology.Names.Results(),
			BatchMin: cfg.OutcomeBatchMin, Memory: cfg.Kept, Log: o.log, Single: cfg.Topology.Replicas == 1,
		})
	}
	return o
}

// CountStart is countStart: one more start of a redelivered job.
func (o *Owner) CountStart(jobID string) (int, error) { return o.countStart(jobID) }

// ForgetStarts is forgetStarts: a finished job's start counter dropped.
func (o *Owner) ForgetStarts(jobID string) { o.forgetStarts(jobID) }

// PublishOutcomes keeps value as the outcome of each job of ids, as a
// group's outcomes are kept (publishOutcomes).
func (o *Owner) PublishOutcomes(ids []string, value []byte) error {
	ts := make([]*task, len(ids))
	idx := make([]int, len(ids))
	for i, id := range ids {
		ts[i], idx[i] = &task{job: core.Job{ID: id}}, i
	}
	return o.publishOutcomes("$KV."+o.topo.Names.Results()+".", ts, func(int) []byte { return value }, idx)
}

// NoteKept records that an outcome was kept under subject at seq, as a
// tenure's own put does (kept.Store.NoteKept).
func (o *Owner) NoteKept(subject string, seq uint64) { o.kept.NoteKept(subject, seq) }

// SettleAcks is settleAcks: wait until the ack of stream sequence want
// is applied.
func SettleAcks(stream jetstream.Stream, cons jetstream.Consumer, want uint64, stop <-chan struct{}, limit time.Duration) bool {
	return settleAcks(stream, cons, want, stop, limit)
}

// The outcome and reply encodings a tenure sends, for tests that check
// them on the wire.
var (
	EncodeResult = encodeResult
	ReplyMsg     = replyMsg
)

// HeldMsg is the notice that the job with reply subject reply is held
// for why (heldMsg).
func HeldMsg(reply string, why error) *nats.Msg { return heldMsg(reply, why) }

// DeadErrorMax bounds a dead letter's error text.
const DeadErrorMax = deadErrorMax
