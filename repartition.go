package keylane

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// RepartitionProgress is called while Repartition waits for the old jobs
// stream to drain, with the number of jobs it still holds.
type RepartitionProgress func(left uint64)

// Repartition changes the namespace's partition count to n, keeping every
// key's state. It must run while workers run (they drain the old stream):
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
//     Clients must be opened again: an old client's jobs are refused by
//     the server (a partition subject that is gone) or dead-lettered with
//     "re-open the client" (Keylane-Partitions), never stored to rot.
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
	s, meta, err := openJobs(ctx, js, namespace)
	if err != nil {
		return err
	}
	info := s.CachedInfo()
	if meta.Partitions == n {
		return nil
	}
	old := info.Config
	frozen := old
	frozen.Subjects = []string{namespace + ".frozen." + formatEpoch(meta.Epoch)}
	if _, err := js.UpdateStream(ctx, frozen); err != nil {
		return fmt.Errorf("keylane: repartition: freeze %s: %w", old.Name, err)
	}
	last, err := drain(ctx, s, progress)
	if err != nil {
		// Unfreeze on a context of its own: ctx has ended.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		if _, uerr := js.UpdateStream(uctx, old); uerr != nil {
			return fmt.Errorf("keylane: repartition: drain: %w; unfreezing %s failed too: %w", err, old.Name, uerr)
		}
		return fmt.Errorf("keylane: repartition: drain (unfrozen, nothing changed): %w", err)
	}
	epoch, err := newEpoch()
	if err != nil {
		return err
	}
	adopted := make([]string, 0, len(meta.Adopted)+1)
	for _, e := range append(meta.Adopted, meta.Epoch) {
		adopted = append(adopted, formatEpoch(e))
	}
	next := old
	next.Subjects = partitionSubjects(namespace, n)
	next.FirstSeq = last + 1
	next.Metadata = maps.Clone(old.Metadata)
	next.Metadata[MetaPartitions] = strconv.Itoa(n)
	next.Metadata[MetaEpoch] = formatEpoch(epoch)
	next.Metadata[MetaAdopted] = strings.Join(adopted, ",")
	next.Metadata[MetaReplyPrefix] = meta.ReplyPrefix
	if err := js.DeleteStream(ctx, old.Name); err != nil {
		return fmt.Errorf("keylane: repartition: delete the drained %s: %w", old.Name, err)
	}
	if _, err := js.CreateStream(ctx, next); err != nil {
		return fmt.Errorf("keylane: repartition: create %s with %d partitions (the old stream is gone and was empty; create it with Setup{Partitions: %d}): %w", old.Name, n, n, err)
	}
	return nil
}

// drain waits until the stream holds no job and returns its last sequence.
func drain(ctx context.Context, s jetstream.Stream, progress RepartitionProgress) (uint64, error) {
	pause := 10 * time.Millisecond
	for {
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		if progress != nil {
			progress(info.State.Msgs)
		}
		if info.State.Msgs == 0 {
			return info.State.LastSeq, nil
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
