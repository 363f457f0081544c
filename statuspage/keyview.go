package statuspage

import (
	"context"
	"errors"
	"fmt"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// keyScan bounds the stored messages one key's look-up reads (one
// request each) to count the key's jobs.
const keyScan = 500

// keyJobs counts the jobs of key stored in its partition of the jobs
// stream: a work queue, so what it holds is not yet acknowledged. Those
// after the consumer's last delivery are queued; those before it were
// delivered and are running, waiting to be retried, or (in a batch
// message some of whose jobs are still running) done. It reads the key's
// one-job messages and the partition's batch messages, the latter
// decoded for their keys; at most keyScan messages, after which the
// counts are lower bounds (kv.Cut).
func keyJobs(ctx context.Context, js jetstream.JetStream, namespace, key string, st *keylane.Status, kv *KeyView) error {
	names := keylane.Names{Namespace: namespace}
	s, err := js.Stream(ctx, names.JobsShard(keylane.ShardOf(kv.Partition, st.Shards)))
	if err != nil {
		return fmt.Errorf("jobs stream: %w", err)
	}
	var delivered uint64
	c, err := s.Consumer(ctx, names.Consumer(kv.Partition))
	switch {
	case err == nil:
		delivered = c.CachedInfo().Delivered.Stream
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("consumer of partition %d: %w", kv.Partition, err)
	}
	reads := 0
	for _, subj := range []string{partition.Subject(namespace, kv.Partition, key), wire.BatchSubject(namespace, kv.Partition)} {
		for seq := uint64(1); ; seq++ {
			if reads == keyScan {
				kv.Cut = true
				return nil
			}
			reads++
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return fmt.Errorf("reading the jobs of partition %d: %w", kv.Partition, err)
			}
			seq = m.Sequence
			n := 1
			if subj != partition.Subject(namespace, kv.Partition, key) {
				n = 0
				jobs, err := wire.DecodeBatch(m.Data)
				if err != nil {
					continue // malformed: the worker dead-letters it whole
				}
				for _, j := range jobs {
					if j.Key == key {
						n++
					}
				}
			}
			if seq > delivered {
				kv.Queued += n
			} else {
				kv.Delivered += n
			}
		}
	}
	return nil
}
