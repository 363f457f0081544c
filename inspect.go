package keylane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// Status is what Inspect reports of a namespace: its topology, its live
// workers, its dead letters and each partition's owner and queue.
type Status struct {
	Namespace  string
	Partitions int
	Shards     int
	Hash       string
	Replicas   int
	// MaxKeyBacklog is the per-key backlog cap (TopologyConfig), 0 for none.
	MaxKeyBacklog int64
	// Delays reports whether the namespace takes delayed jobs.
	Delays bool
	// Epochs holds each jobs stream shard's epoch.
	Epochs []uint64
	// Members are the workers with a live member entry, sorted: one
	// renewed within two thirds of the lease TTL by the server's clock
	// (lease.Lapsed). A killed worker leaves them a renew period or two
	// after it died, though the server keeps its entry for the TTL.
	Members []string
	// DeadLetters counts the messages of the dead-letter stream.
	DeadLetters uint64
	Partition   []PartitionStatus
}

// PartitionStatus is one partition as Inspect saw it.
type PartitionStatus struct {
	Partition int
	// Owner holds the partition's lease; empty if it is free.
	Owner string
	// Fence is the owner's fencing token: the revision of the Create that
	// began its tenure, as Job.Fence, dead letters and the owner's logs
	// give it; renews do not move it.
	Fence uint64
	// Since is when the owner took the lease, by its own clock.
	Since time.Time
	// Lapsed reports that the owner's lease was not renewed for two
	// thirds of the TTL, by the server's clock (lease.Lapsed): the owner
	// is not known to be alive (killed, cut off from NATS), yet nobody
	// else may take the partition until the server drops the entry, a
	// TTL after its last renew.
	Lapsed bool
	// Pending counts the partition's stored jobs not yet delivered: a
	// batch message counts as the jobs it carries (Keylane-Batch-Jobs).
	Pending uint64
	// InFlight counts jobs delivered and not yet acked.
	InFlight int
	// Redelivered counts delivered jobs that were delivered more than once.
	Redelivered int
	// LastActive is when the partition's consumer last delivered a job
	// (zero if it never did, or has no consumer).
	LastActive time.Time
}

// Inspect reads a namespace's state for an operator (keylane status): the
// topology from the jobs streams' metadata, the members and leases from
// their buckets, each partition's consumer, and the dead-letter count. It
// only reads; each request is bounded by requestTimeout. A partition
// whose consumer does not exist (no owner yet) has zero counts.
func Inspect(ctx context.Context, js jetstream.JetStream, namespace string) (Status, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	streams, metas, err := openShards(ctx, js, namespace)
	if err != nil {
		return Status{}, err
	}
	names := Names{Namespace: namespace}
	info := streams[0].CachedInfo()
	st := Status{Namespace: namespace, Partitions: metas[0].Partitions, Shards: len(streams), Hash: info.Config.Metadata[MetaHash], Replicas: info.Config.Replicas, MaxKeyBacklog: metas[0].MaxKeyBacklog, Delays: metas[0].Delays}
	for _, m := range metas {
		st.Epochs = append(st.Epochs, m.Epoch)
	}
	if dead, err := js.Stream(ctx, names.Dead()); err == nil {
		st.DeadLetters = dead.CachedInfo().State.Msgs
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return Status{}, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	// Entries' ages are read against the server's clock (the stream
	// info's time stamp), not this machine's.
	now := info.TimeStamp
	if now.IsZero() {
		now = time.Now() // a server that does not say
	}
	if members, err := js.KeyValue(ctx, names.Members()); err == nil {
		live, err := liveEntries(ctx, members, now)
		if err != nil {
			return Status{}, fmt.Errorf("keylane: members: %w", err)
		}
		st.Members = live
	}
	leases, err := js.KeyValue(ctx, names.Leases())
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return Status{}, fmt.Errorf("keylane: leases: %w", err)
	}
	var ttl time.Duration
	if leases != nil {
		kst, err := leases.Status(ctx)
		if err != nil {
			return Status{}, fmt.Errorf("keylane: leases: %w", err)
		}
		ttl = kst.TTL()
	}
	for p := range st.Partitions {
		ps := PartitionStatus{Partition: p}
		if leases != nil {
			holder, _, written, err := lease.ReadWritten(ctx, leases, names.LeaseKey(p))
			switch {
			case err == nil:
				ps.Owner, ps.Fence, ps.Since = holder.Holder, holder.Fence, holder.AcquiredAt
				ps.Lapsed = lease.Lapsed(written, now, ttl)
			case !errors.Is(err, lease.ErrFree):
				return Status{}, fmt.Errorf("keylane: lease of partition %d: %w", p, err)
			}
		}
		cons, err := streams[ShardOf(p, len(streams))].Consumer(ctx, names.Consumer(p))
		switch {
		case err == nil:
			ci := cons.CachedInfo()
			ps.Pending, ps.InFlight, ps.Redelivered = ci.NumPending, ci.NumAckPending, ci.NumRedelivered
			if ci.NumPending > 0 {
				// The undelivered messages are those after the last delivered.
				s := streams[ShardOf(p, len(streams))]
				extra, err := batchJobsBeyond(ctx, s, wire.BatchSubject(namespace, p), ci.Delivered.Stream, s.CachedInfo().State.LastSeq)
				if err != nil {
					return Status{}, fmt.Errorf("keylane: batches of partition %d: %w", p, err)
				}
				ps.Pending += extra
			}
			if ci.Delivered.Last != nil {
				ps.LastActive = *ci.Delivered.Last
			}
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return Status{}, fmt.Errorf("keylane: consumer of partition %d: %w", p, err)
		}
		st.Partition = append(st.Partition, ps)
	}
	return st, nil
}

// batchJobsBeyond returns how many jobs more than messages the batch
// messages of s on subject (one partition's wire.BatchSubject, or every
// partition's with a wildcard) hold whose sequences are above after and
// at most last: the sum of each one's Keylane-Batch-Jobs less one. A
// message without a valid count is malformed (the worker dead-letters it
// whole) and counts as one. It reads each such message with a request of
// its own, and the server sends the body along (there is no headers-only
// read of a stored message), so its cost grows with the batch messages
// stored, up to batchJobsReads of them: the ones after those count as
// one job each (the count is then a lower bound); none costs one
// request. A backlog of more than batchJobsReads batch messages is one
// that a poll of its exact size would only load further.
func batchJobsBeyond(ctx context.Context, s jetstream.Stream, subject string, after, last uint64) (uint64, error) {
	var extra uint64
	for seq, reads := after+1, 0; seq <= last && reads < batchJobsReads; reads++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return 0, err
		}
		if m.Sequence > last || m.Sequence < seq {
			break
		}
		if n, err := strconv.Atoi(m.Header.Get(wire.HeaderBatchJobs)); err == nil && n > 1 && n <= wire.MaxBatchJobs {
			extra += uint64(n - 1)
		}
		seq = m.Sequence + 1
	}
	return extra, nil
}

// batchJobsReads bounds the batch messages batchJobsBeyond reads.
const batchJobsReads = 256

// allBatchesSubject is the subject of every partition's batch messages.
func allBatchesSubject(namespace string) string {
	return namespace + ".jobs.*." + wire.BatchToken
}

// liveEntries returns, sorted, the keys of a lease bucket (the members)
// whose entry has not lapsed as of now, the server's time (lease.Lapsed):
// one watch of the bucket's entries, without their values.
func liveEntries(ctx context.Context, kv jetstream.KeyValue, now time.Time) ([]string, error) {
	kst, err := kv.Status(ctx)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var live []string
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("the watch ended")
			}
			if e == nil { // the initial values are all in
				slices.Sort(live)
				return live, nil
			}
			if !lease.Lapsed(e.Created(), now, kst.TTL()) {
				live = append(live, e.Key())
			}
		}
	}
}
