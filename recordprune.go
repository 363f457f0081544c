package keylane

import (
	"context"
	"fmt"
	"time"
)

// MinRecordRetention is the shortest RecordRetention a worker with cfg
// accepts (cfg as NewWorker and Start complete it: defaults set, MaxDeliver
// resolved): the longest of the results TTL, the duplicate window, and
// (MaxDeliver+2) × (AckWait + LeaseTTL). See RecordPruner.
func MinRecordRetention(cfg WorkerConfig) time.Duration {
	redeliver := time.Duration(cfg.MaxDeliver+2) * (cfg.AckWait + cfg.Topology.LeaseTTL)
	return max(cfg.Topology.ResultsTTL, cfg.Topology.DuplicateWindow, redeliver)
}

// recordClockMargin is taken off the oldest pending job's publish time
// before it bounds a prune: NATS's clock and the database's may differ.
const recordClockMargin = time.Minute

// recordPruneTimeout bounds one prune.
const recordPruneTimeout = 10 * time.Minute

// recordPruneEvery is how often a worker prunes for a retention r: a
// 24th of it, between a minute and an hour.
func recordPruneEvery(r time.Duration) time.Duration {
	return min(max(r/24, time.Minute), time.Hour)
}

// checkRecordRetention refuses an Applier's retention shorter than
// MinRecordRetention, and returns the retention the worker prunes to (0:
// none).
func (w *Worker) checkRecordRetention() (time.Duration, error) {
	p, ok := w.cfg.Applier.(RecordPruner)
	if !ok {
		return 0, nil
	}
	r := p.RecordRetention()
	if r < 0 {
		return 0, nil
	}
	if least := MinRecordRetention(w.cfg); r < least {
		c := w.cfg
		return 0, fmt.Errorf("%w: it keeps outcomes %s, and a job can come back for %s (results TTL %s, duplicate window %s, (MaxDeliver %d + 2) × (AckWait %s + lease TTL %s)); keep them at least that long",
			ErrRecordRetention, r, least, c.Topology.ResultsTTL, c.Topology.DuplicateWindow, c.MaxDeliver, c.AckWait, c.Topology.LeaseTTL)
	}
	return r, nil
}

// pruneRecord prunes the Applier's record every recordPruneEvery(r),
// the first time a lease TTL after Start, until Stop.
func (w *Worker) pruneRecord(namespace string, r time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	p := w.cfg.Applier.(RecordPruner)
	wait := w.cfg.Topology.LeaseTTL
	for {
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		wait = recordPruneEvery(r)
		ctx, cancel := context.WithTimeout(context.Background(), recordPruneTimeout)
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		before, err := w.recordPruneBefore(ctx, r)
		if err != nil {
			w.log.Warn("record not pruned: the oldest pending job is unknown", "err", err)
			cancel()
			continue
		}
		start := time.Now()
		n, err := p.PruneRecord(ctx, namespace, before)
		cancel()
		if err != nil {
			w.log.Warn("record prune failed", "before", before, "deleted", n, "err", err)
			continue
		}
		w.log.Info("record pruned", "before", before, "deleted", n, "took", time.Since(start).Round(time.Millisecond))
	}
}

// recordPruneBefore is the time a prune deletes outcomes before: now less
// the retention r, and no later than the publish time of the oldest job
// still in a jobs stream (a work queue: acked jobs leave it), less
// recordClockMargin.
func (w *Worker) recordPruneBefore(ctx context.Context, r time.Duration) (time.Time, error) {
	before := time.Now().Add(-r)
	w.mu.Lock()
	streams := w.topo.Streams
	w.mu.Unlock()
	for _, s := range streams {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		info, err := s.Info(rctx)
		cancel()
		if err != nil {
			return time.Time{}, err
		}
		if info.State.Msgs > 0 {
			if oldest := info.State.FirstTime.Add(-recordClockMargin); oldest.Before(before) {
				before = oldest
			}
		}
	}
	return before, nil
}
