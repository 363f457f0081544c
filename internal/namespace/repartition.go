package namespace

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// RepartitionProgress is called while Repartition waits for the old jobs
// stream to drain, with the number of jobs it still holds.
type RepartitionProgress func(left uint64)

// Repartition changes the namespace's partition count to n, keeping every
// key's state and the number of jobs stream shards (every shard goes
// through the steps below; n must be at least the shard count). It must run while workers run (they drain the old stream):
//
//  1. Freeze: the old jobs stream's subjects move off the partition
//     subjects, so new jobs are refused at once (clients get "no response
//     from stream"); consumers keep delivering what it holds.
//  2. Drain: wait until the workers finished every stored job, calling
//     progress now and then. If ctx ends first the stream is unfrozen and
//     Repartition returns an error: nothing changed.
//  3. Switch: the old stream is deleted and a new one created with n
//     partitions, a new epoch that adopts the old one (and those it
//     adopted), its sequences continuing after the old stream's last, and
//     the same duplicate window, replicas, size limit and reply prefix.
//  4. Resume: workers see the new epoch, hand their partitions over, open
//     the new topology and balance its n partitions (within a lease TTL).
//     Clients must be opened again: an old client's jobs are refused (a
//     partition subject that is gone: core.ErrPartitionMismatch at publish) or
//     dead-lettered with "re-open the client" (Keylane-Partitions), never
//     stored to rot.
//
// Per-key state stays in the state bucket, keyed by resource key; state
// entries of the old epoch are adopted, so their held job IDs still answer
// retries. Between the delete and the create (milliseconds) a worker that
// starts creates no stream (workers only create a missing stream at Start;
// start none during a repartition).
func Repartition(ctx context.Context, js jetstream.JetStream, namespace string, n int, progress RepartitionProgress) error {
	if err := partition.ValidateCount(n); err != nil {
		return err
	}
	streams, metas, err := OpenShards(ctx, js, namespace)
	if err != nil {
		return err
	}
	meta := JoinMeta(metas)
	if meta.Partitions == n {
		return nil
	}
	if n < meta.Shards {
		return fmt.Errorf("%w: %d partitions for %d jobs stream shards: every shard needs a partition", core.ErrShardsMismatch, n, meta.Shards)
	}
	olds := make([]jetstream.StreamConfig, len(metas))
	for i, m := range metas {
		olds[i] = m.Info.Config
	}
	// unfreeze restores the shards frozen so far, on a context of its own:
	// ctx may have ended.
	unfreeze := func(frozen int, cause error) error {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), core.RequestTimeout)
		defer cancel()
		for _, old := range olds[:frozen] {
			if _, uerr := js.UpdateStream(uctx, old); uerr != nil {
				return fmt.Errorf("keylane: repartition: %w; unfreezing %s failed too: %w", cause, old.Name, uerr)
			}
		}
		return fmt.Errorf("keylane: repartition (unfrozen, nothing changed): %w", cause)
	}
	for i, old := range olds {
		frozen := old
		frozen.Subjects = []string{namespace + ".frozen." + FormatEpoch(metas[i].Epoch)}
		if _, err := js.UpdateStream(ctx, frozen); err != nil {
			return unfreeze(i, fmt.Errorf("freeze %s: %w", old.Name, err))
		}
	}
	if meta.Delays {
		// Frozen, the streams take no new delayed job; one that waits
		// for its time would come due on its old partition's subject,
		// so the namespace keeps its N until they have run.
		if n, err := pendingDelays(ctx, js, streams, Names{Namespace: namespace}); err != nil || n > 0 {
			return unfreeze(len(olds), errors.Join(fmt.Errorf("%d delayed jobs wait for their time; repartition when they have run", n), err))
		}
	}
	last, err := drain(ctx, streams, progress)
	if err != nil {
		return unfreeze(len(olds), fmt.Errorf("drain: %w", err))
	}
	adopted := make([]string, 0, len(meta.Adopted)+len(metas))
	for _, e := range meta.Adopted {
		adopted = append(adopted, FormatEpoch(e))
	}
	for _, m := range metas {
		adopted = append(adopted, FormatEpoch(m.Epoch))
	}
	nexts := make([]jetstream.StreamConfig, len(olds))
	for i, old := range olds {
		epoch, err := newEpoch()
		if err != nil {
			return unfreeze(len(olds), err)
		}
		next := old
		next.Subjects = ShardSubjects(namespace, n, meta.Shards, i, meta.Delays)
		next.Sources = nil
		if meta.Delays {
			next.Sources = dueSources(Names{Namespace: namespace}, n, meta.Shards, i)
		}
		// Every shard continues after the highest sequence any shard had.
		next.FirstSeq = last + 1
		next.Metadata = maps.Clone(old.Metadata)
		next.Metadata[MetaPartitions] = strconv.Itoa(n)
		next.Metadata[MetaEpoch] = FormatEpoch(epoch)
		next.Metadata[MetaAdopted] = strings.Join(adopted, ",")
		next.Metadata[MetaReplyPrefix] = meta.ReplyPrefix
		next.Metadata[MetaVersion] = SubjectsVersion
		nexts[i] = next
	}
	for _, old := range olds {
		if err := js.DeleteStream(ctx, old.Name); err != nil {
			return fmt.Errorf("keylane: repartition: delete the drained %s: %w", old.Name, err)
		}
	}
	// Shard 0 last: clients and workers open it first, and find the others.
	for i := len(nexts) - 1; i >= 0; i-- {
		if _, err := js.CreateStream(ctx, nexts[i]); err != nil {
			return fmt.Errorf("keylane: repartition: create %s with %d partitions (the old streams are gone and were empty; create them with Setup{Partitions: %d, StreamShards: %d}): %w", nexts[i].Name, n, n, meta.Shards, err)
		}
	}
	return nil
}

// pendingDelays counts the delayed jobs that have not reached the jobs
// streams yet: submissions not yet moved into the delays stream, and
// schedules waiting for their time there; and due copies the jobs streams
// have not sourced yet (their sources' lag). Counted in that order, a
// submission moved meanwhile is seen as a schedule (its schedule is stored
// before the submission is acked).
func pendingDelays(ctx context.Context, js jetstream.JetStream, streams []jetstream.Stream, names Names) (uint64, error) {
	var n uint64
	for _, s := range streams {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(names.Namespace+".delay.>"))
		if err != nil {
			return 0, err
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	d, err := js.Stream(ctx, names.Delays())
	if err != nil {
		return 0, fmt.Errorf("delays stream: %w", err)
	}
	info, err := d.Info(ctx, jetstream.WithSubjectFilter(names.Namespace+".sched.>"))
	if err != nil {
		return 0, err
	}
	for _, c := range info.State.Subjects {
		n += c
	}
	for _, s := range streams {
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		for _, src := range info.Sources {
			n += src.Lag
		}
	}
	return n, nil
}

// drain waits until the streams hold no job and returns the highest last
// sequence among them.
func drain(ctx context.Context, streams []jetstream.Stream, progress RepartitionProgress) (uint64, error) {
	pause := 10 * time.Millisecond
	for {
		var left, last uint64
		for _, s := range streams {
			info, err := s.Info(ctx)
			if err != nil {
				return 0, err
			}
			left += info.State.Msgs
			last = max(last, info.State.LastSeq)
		}
		if progress != nil {
			progress(left)
		}
		if left == 0 {
			return last, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}
