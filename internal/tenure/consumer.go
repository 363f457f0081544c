package tenure

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go/jetstream"
)

// openConsumer re-creates the partition's consumer (resetConsumer). A
// failure that waiting may cure (a request lost in a Raft election, a
// stream or consumer without a leader, a connection down) is retried with
// backoff for as long as the tenure lasts: each request of the first
// attempt is bounded by consumerAttempt, so the partition resumes within
// moments of the stream's new leader, and the lease stays with this owner
// meanwhile (its watchdog renews it if the leases bucket answers; if not,
// the lease lapses and the tenure ends). Once attempts have failed for
// longer than an election takes (consumerGrowAfter), the bound doubles
// with every further failed attempt, up to consumerAttemptMax: a timeout
// is not a no, and a meta leader that answers this worker's server
// slower than the bound (its replies held seconds behind on the route)
// would otherwise fail every attempt for as long as that lasts, the
// partition owned and running nothing
// (TestOwnerCreatesItsConsumerThroughASlowMetaLeader). A replaced or
// missing stream is returned at once.
func (o *Owner) openConsumer(pause *resyncBackoff) (jetstream.Consumer, error) {
	start := time.Now()
	bound := consumerAttempt
	for attempt := 1; ; attempt++ {
		cons, err := o.resetConsumer(bound)
		if err == nil && attempt > 1 {
			o.log.Info("partition consumer ready", "attempts", attempt, "took", time.Since(start).Round(time.Millisecond))
		}
		if err == nil || !transient(err) {
			return cons, err
		}
		if attempt == 1 || attempt%10 == 0 {
			o.log.Warn("partition consumer not ready; retrying", "attempt", attempt, "bound", bound, "err", err)
		}
		if time.Since(start) >= consumerGrowAfter {
			bound = min(2*bound, consumerAttemptMax)
		}
		if !pause.wait(o.ctx, o.abortCh, o.handoverCh, o.l.Done()) {
			return nil, err
		}
	}
}

// transient reports whether a failed request may succeed if asked again:
// a timeout, no responders or no leader (a Raft election), a connection
// being re-established.
func transient(err error) bool {
	if errors.Is(err, errTopologyChanged) {
		return false
	}
	return natserr.IsTransient(err)
}

// resyncBackoff spaces out re-synchronisations (and consumer re-creation
// attempts) of one tenure: 20ms after the first, doubling to at most
// resyncMaxPause while they follow each other closely.
type resyncBackoff struct {
	next time.Duration
	last time.Time
}

// wait sleeps before the next re-synchronisation; it reports false if the
// tenure ended first.
func (b *resyncBackoff) wait(ctx context.Context, abort, handover, lost <-chan struct{}) bool {
	if b.next == 0 || time.Since(b.last) > core.ResyncCalm {
		b.next = 20 * time.Millisecond
	}
	t := time.NewTimer(b.next)
	defer t.Stop()
	b.next = min(2*b.next, resyncMaxPause)
	defer func() { b.last = time.Now() }()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-abort:
	case <-handover:
	case <-lost:
	}
	return false
}

// resyncMaxPause caps the pause between re-synchronisations, and
// consumerAttempt bounds each request of an early attempt to re-create the
// consumer: a request lost in an election is asked again, not waited out.
// Attempts made consumerGrowAfter after the first double it, up to
// consumerAttemptMax (openConsumer): by then no election explains the
// timeouts (nats-server's election timeout is 4-9s), and a slow answer
// is waited for.
const (
	resyncMaxPause     = time.Second
	consumerAttempt    = 2 * time.Second
	consumerGrowAfter  = 10 * time.Second
	consumerAttemptMax = 16 * time.Second
	// consumerLeaderWait bounds the wait for a new replicated consumer's
	// first leader within one attempt. A new group elects its preferred
	// peer at once; the server may prefer a peer that died moments ago
	// (it learns of a SIGKILLed node only after missed heartbeats), and
	// then the group waits an election timeout (4-9s). Re-creating the
	// consumer draws another preferred peer, so the attempt gives up early.
	consumerLeaderWait = 2 * time.Second
	// consumerInfoWait bounds the old consumer's info: its leader answers
	// in milliseconds, and without one the owner does not wait for it.
	consumerInfoWait = 500 * time.Millisecond
)

func (o *Owner) resetConsumer(bound time.Duration) (jetstream.Consumer, error) {
	// Each request gets its own bound: a request lost in an election
	// fails the attempt quickly, and openConsumer asks again.
	req := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(o.ctx, bound)
	}
	topo := o.topo
	jobs := topo.StreamOf(o.p)
	// Never consume a jobs stream of another epoch than this worker's
	// topology (a repartition replaced it, or the shard was created
	// again): the worker reloads first.
	ctx, cancel := req()
	info, err := jobs.Info(ctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("jobs stream: %w", err)
	}
	if meta, err := namespace.ReadMeta(info, 0); err != nil || meta.Epoch != topo.EpochOf(o.p) {
		o.cfg.RequestReload()
		return nil, errTopologyChanged
	}
	name := topo.Names.Consumer(o.p)
	// A consumer with a leader answers its info at once; one without is
	// not waited for (see the transient case below).
	ctx, cancel = context.WithTimeout(o.ctx, consumerInfoWait)
	old, err := jobs.Consumer(ctx, name)
	cancel()
	switch {
	case err == nil:
		info := old.CachedInfo()
		// Carry the mark across generations: an owner that handed over
		// before anything reached it must not hide what its predecessor
		// had delivered.
		inherited, _ := strconv.ParseUint(info.Config.Metadata[metaDelivered], 10, 64)
		o.prevDelivered = max(o.prevDelivered, info.Delivered.Stream, inherited)
		if err := o.deleteConsumer(name, bound); err != nil {
			return nil, err
		}
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case transient(err):
		// The old consumer does not answer: its leader was lost and its
		// group is still electing one (up to 9s). Its delivered mark is
		// unknown, so take the stream's last sequence once the consumer is
		// gone: nothing it delivered lies above that, and every job up to
		// it is treated as maybe delivered before (checked against held
		// outcomes and stored results), which costs lookups, not safety.
		if err := o.deleteConsumer(name, bound); err != nil {
			return nil, err
		}
		ctx, cancel = req()
		info, err := jobs.Info(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("jobs stream: %w", err)
		}
		o.prevDelivered = max(o.prevDelivered, info.State.LastSeq)
	default:
		return nil, fmt.Errorf("old consumer: %w", err)
	}
	cfg := topo.ConsumerConfig(o.p, o.cfg.AckWait, o.cfg.MaxPending)
	cfg.Metadata = map[string]string{metaDelivered: strconv.FormatUint(o.prevDelivered, 10)}
	ctx, cancel = req()
	cons, err := jobs.CreateOrUpdateConsumer(ctx, cfg)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	if topo.Replicas < 2 {
		return cons, nil
	}
	// A replicated consumer answers pulls only once it has a leader; a
	// pull sent before is lost until it expires.
	wait, cancelWait := context.WithTimeout(o.ctx, max(consumerLeaderWait, bound))
	defer cancelWait()
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		ctx, cancel := context.WithTimeout(wait, bound)
		info, err := cons.Info(ctx)
		cancel()
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
			return cons, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-wait.Done():
			t.Stop()
			return nil, fmt.Errorf("consumer %s has no leader: %w", name, wait.Err())
		case <-t.C:
		}
	}
}

// deleteConsumer deletes the partition's consumer (a meta request: it
// needs no leader of the consumer's own group). Gone already is success.
func (o *Owner) deleteConsumer(name string, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(o.ctx, bound)
	defer cancel()
	if err := o.topo.StreamOf(o.p).DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete old consumer: %w", err)
	}
	return nil
}

// metaDelivered is the consumer metadata key that records the highest
// stream sequence any earlier consumer of the partition had delivered.
const metaDelivered = "keylane.delivered-before"
