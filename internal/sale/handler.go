package sale

import (
	"context"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/inventory"
)

// Handler is the inventory handler with the knobs of tests and demos: a
// pause inside every run's critical section, and a tracker that sees every
// run. It runs as a Reducer (the worker keeps the stock) or as a Handler
// (one write through Inventory.State per job), like the inventory handler.
// Jobs that are not inventory commands pass straight to Inventory, neither
// held nor tracked. It is safe for concurrent use.
type Handler struct {
	// Inventory applies the commands. Required.
	Inventory *inventory.Handler
	// Hold is a pause between reading and writing the stock, to simulate a
	// slow critical section. "get" jobs run as a Handler read without it;
	// "fail" jobs fail without it. Defaults to none.
	Hold time.Duration
	// Tracker, when set, sees every run start and end, and whether its
	// state write took effect. Defaults to none.
	Tracker *Tracker
}

// Reduce implements keylane's Reducer.
func (h *Handler) Reduce(ctx context.Context, job keylane.Job, cur []byte) ([]byte, []byte, error) {
	cmd, err := inventory.Parse(job.Payload)
	if err != nil {
		return h.Inventory.Reduce(ctx, job, cur)
	}
	if h.Tracker != nil {
		h.Tracker.Start(job)
		defer h.Tracker.End(job)
	}
	return h.reduce(ctx, job, cmd, cur)
}

// Committed implements keylane's CommitObserver: it tells the tracker
// whether a run's outcome was stored, which a worker that group-commits
// knows only after the run ended.
func (h *Handler) Committed(job keylane.Job, applied bool) {
	if h.Tracker != nil {
		h.Tracker.Outcome(job, applied)
	}
}

// CommitUncertain implements keylane's UncertainCommitObserver: the run's
// write may have landed (its answer never came).
func (h *Handler) CommitUncertain(job keylane.Job) {
	if h.Tracker != nil {
		h.Tracker.OutcomeUnknown(job)
	}
}

// Handle implements keylane's Handler.
func (h *Handler) Handle(ctx context.Context, job keylane.Job) ([]byte, error) {
	cmd, err := inventory.Parse(job.Payload)
	if err != nil {
		return h.Inventory.Handle(ctx, job)
	}
	var applied bool
	if h.Tracker != nil {
		h.Tracker.Start(job)
		defer func() { h.Tracker.Outcome(job, applied) }()
		defer h.Tracker.End(job)
	}
	if cmd.Op == "get" {
		return h.Inventory.Handle(ctx, job)
	}
	// The write is the inventory handler's own (State.Apply of its
	// Reduce), with the hold inside it, between the read and the write.
	res, err := h.Inventory.State.Apply(ctx, job, func(cur []byte) ([]byte, []byte, error) {
		next, out, err := h.reduce(ctx, job, cmd, cur)
		applied = err == nil
		return next, out, err
	})
	if err != nil {
		applied = false
	}
	return res, err
}

// reduce holds, unless the command fails anyway, then applies it.
func (h *Handler) reduce(ctx context.Context, job keylane.Job, cmd inventory.Command, cur []byte) ([]byte, []byte, error) {
	if h.Hold > 0 && cmd.Op != "fail" {
		t := time.NewTimer(h.Hold)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		}
	}
	return h.Inventory.Reduce(ctx, job, cur)
}
