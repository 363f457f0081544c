package keylane

import (
	"context"

	ns "github.com/keylane/keylane/internal/namespace"
	"github.com/nats-io/nats.go/jetstream"
)

// The operator's calls on a namespace (open, adopt, repartition, list,
// delete, leaders), each package namespace's.

// Names derives every NATS object name from a namespace.
type Names = ns.Names

// Meta is what a jobs stream's metadata says about its namespace.
type Meta = ns.Meta

// MetaMaxDeliver is the jobs stream's metadata key for Meta.MaxDeliver.
const MetaMaxDeliver = ns.MetaMaxDeliver

// MetaDelays is the jobs stream's metadata key for Meta.Delays; its value
// is "2" (namespace.DelaysScheme): delayed jobs wait in a delays stream
// only workers publish to.
const MetaDelays = ns.MetaDelays

// Open reads an existing namespace for a client: it checks the metadata
// of every jobs stream shard and returns shard 0's, with the adopted
// epochs of all. A non-zero want that differs from the stream's partition
// count is refused with ErrPartitionMismatch.
func Open(ctx context.Context, js jetstream.JetStream, namespace string, want int) (Meta, error) {
	return ns.Open(ctx, js, namespace, want)
}

// AdoptEpoch makes the namespace's jobs streams carry on the state written
// under an earlier jobs stream's epoch: keys written under it run again
// (their held job IDs still answer retries; their sequences, which mean
// nothing in this stream, are ignored). Use it after a jobs stream (or a
// shard of it) was deleted and created again, once you know the old
// stream's jobs are gone or re-submitted; workers refuse such keys with
// ErrEpoch until then. The epoch is written into every shard.
func AdoptEpoch(ctx context.Context, js jetstream.JetStream, namespace string, epoch uint64) error {
	return ns.AdoptEpoch(ctx, js, namespace, epoch)
}

// RepartitionProgress is called while Repartition waits for the old jobs
// stream to drain, with the number of jobs it still holds.
type RepartitionProgress = ns.RepartitionProgress

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
//     partition subject that is gone: ErrPartitionMismatch at publish) or
//     dead-lettered with "re-open the client" (Keylane-Partitions), never
//     stored to rot.
//
// Per-key state stays in the state bucket, keyed by resource key; state
// entries of the old epoch are adopted, so their held job IDs still answer
// retries. Between the delete and the create (milliseconds) a worker that
// starts creates no stream (workers only create a missing stream at Start;
// start none during a repartition).
func Repartition(ctx context.Context, js jetstream.JetStream, namespace string, n int, progress RepartitionProgress) error {
	return ns.Repartition(ctx, js, namespace, n, progress)
}

// NamespaceObjects lists the streams of a namespace that exist: its jobs
// stream and shards, delays and dead-letter streams, and the streams of
// its buckets (KV_ and the leases, members, results and state bucket
// names), sorted. Nothing of another namespace is listed, even one whose
// name begins with this one's ("shop2" for "shop"). Namespaces whose
// names differ only in "-" and "_" share their object names (Names): a
// jobs, delays or dead-letter stream whose subjects are not this
// namespace's is refused with an error, not listed. The buckets are the
// namespace's only beside its jobs stream (shard 0, its subjects checked
// as above): without it a bucket that bears one of its names (a user's
// ORDERS_STATE on a server with no namespace "orders") is not listed,
// for a name proves nothing (before, DeleteNamespace deleted such a
// bucket: TestDeleteNamespaceLeavesBucketsOfNoNamespace). DeleteNamespace
// removes the jobs stream last, so a delete cut short leaves it to find
// the rest by. An empty list means the namespace does not exist. It only
// reads.
func NamespaceObjects(ctx context.Context, js jetstream.JetStream, namespace string) ([]string, error) {
	return ns.NamespaceObjects(ctx, js, namespace)
}

// LiveLeases returns the partitions of namespace whose lease a worker
// holds, and who holds each, read from the leases bucket; none when the
// bucket does not exist. It only reads.
func LiveLeases(ctx context.Context, js jetstream.JetStream, namespace string) (map[string]string, error) {
	return ns.LiveLeases(ctx, js, namespace)
}

// DeleteNamespace deletes every stream NamespaceObjects lists for
// namespace, and with them every job, delayed job, dead letter, lease,
// member, result and state entry of it: for good. It refuses with
// ErrNamespaceInUse, and deletes nothing, while a worker holds a live
// lease on one of its partitions, unless force is set (the workers then
// fail their next read or write and stop or retry: stop them first). It
// refuses a namespace that does not exist with an error wrapping
// ErrNoTopology. It returns the names it deleted; on an error, those
// deleted before it.
func DeleteNamespace(ctx context.Context, js jetstream.JetStream, namespace string, force bool) ([]string, error) {
	return ns.DeleteNamespace(ctx, js, namespace, force)
}

// ShardLeader says which server leads one jobs stream shard: the server
// that stores and acks every job of the shard's partitions first.
type ShardLeader = ns.ShardLeader

// ShardLeaders returns the leader of every jobs stream shard of the
// namespace, by shard.
func ShardLeaders(ctx context.Context, js jetstream.JetStream, namespace string) ([]ShardLeader, error) {
	return ns.ShardLeaders(ctx, js, namespace)
}

// SpreadLeaders moves shard leaders so that no server leads more than
// ⌈S/servers⌉ shards where the replicas allow it: the stream leader does
// a shard's storage work, and shards whose leaders share a server share
// its cores. It asks an overloaded leader to step down in favour of the
// least loaded current follower (the stepdown's preferred placement,
// nats-server 2.11 and later) and waits for the new leader. The cluster
// elects leaders on its own again after a failure or restart, so run it
// after those too. It returns the leaders after the moves; it changes
// nothing on a single server.
func SpreadLeaders(ctx context.Context, js jetstream.JetStream, namespace string) ([]ShardLeader, error) {
	return ns.SpreadLeaders(ctx, js, namespace)
}

// The engine's names for package namespace's, so their call sites read as
// before.

// shardMeta is one shard's Meta and the stream info it was read from.
type shardMeta = ns.ShardMeta

// openShards opens every jobs stream shard of the namespace and checks
// that they agree; a missing shard is ErrNoTopology.
func openShards(ctx context.Context, js jetstream.JetStream, namespace string) ([]jetstream.Stream, []shardMeta, error) {
	return ns.OpenShards(ctx, js, namespace)
}

// joinMeta is the namespace's Meta from its shards' (namespace.JoinMeta).
func joinMeta(metas []shardMeta) Meta { return ns.JoinMeta(metas) }

// readMeta reads and checks a jobs stream's metadata (namespace.ReadMeta).
func readMeta(info *jetstream.StreamInfo, want int) (Meta, error) { return ns.ReadMeta(info, want) }

// checkMeta checks a jobs stream's partition count and hash against want
// (0: any) and returns its partition count (namespace.CheckMeta).
func checkMeta(sc jetstream.StreamConfig, want int) (int, error) { return ns.CheckMeta(sc, want) }

// formatEpoch is an epoch as the metadata writes it (hex).
func formatEpoch(e uint64) string { return ns.FormatEpoch(e) }

// apiPrefix is the JetStream API prefix js sends requests under
// (namespace.APIPrefix).
func apiPrefix(js jetstream.JetStream) string { return ns.APIPrefix(js) }

// allowAtomicPublish lets stream name take atomic batches
// (namespace.AllowAtomicPublish).
func allowAtomicPublish(ctx context.Context, js jetstream.JetStream, name string) error {
	return ns.AllowAtomicPublish(ctx, js, name)
}
