package namespace

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
)

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
	if !namespaceRE.MatchString(namespace) {
		return nil, fmt.Errorf("keylane: namespace %q must match %s", namespace, namespaceRE)
	}
	names := Names{Namespace: namespace}
	kv := map[string]bool{}
	for _, b := range []string{names.Leases(), names.Members(), names.Results(), names.State()} {
		kv["KV_"+b] = true
	}
	ctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	var out, buckets []string
	jobs := false
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		name := info.Config.Name
		switch {
		case kv[name]:
			buckets = append(buckets, name)
			continue
		case name == names.Jobs(), name == names.Delays(), name == names.Dead(), isShardOf(name, names):
			for _, s := range info.Config.Subjects {
				if !strings.HasPrefix(s, namespace+".") {
					return nil, fmt.Errorf("keylane: stream %s takes subject %s, not namespace %s's: another namespace shares its object names", name, s, namespace)
				}
			}
		default:
			continue
		}
		jobs = jobs || name == names.Jobs()
		out = append(out, name)
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("keylane: list streams: %w", err)
	}
	if jobs {
		out = append(out, buckets...)
	}
	slices.Sort(out)
	return out, nil
}

// isShardOf reports whether stream name is a jobs stream shard above 0 of
// names (Names.JobsShard).
func isShardOf(name string, names Names) bool {
	rest, ok := strings.CutPrefix(name, names.Jobs()+"_")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(rest)
	return err == nil && n > 0 && strconv.Itoa(n) == rest
}

// LiveLeases returns the partitions of namespace whose lease a worker
// holds, and who holds each, read from the leases bucket; none when the
// bucket does not exist. It only reads.
func LiveLeases(ctx context.Context, js jetstream.JetStream, namespace string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, Names{Namespace: namespace}.Leases())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("keylane: leases: %w", err)
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("keylane: leases: %w", err)
	}
	held := map[string]string{}
	for _, k := range keys {
		info, _, err := lease.Read(ctx, kv, k)
		switch {
		case err == nil:
			held[k] = info.Holder
		case !errors.Is(err, lease.ErrFree):
			return nil, fmt.Errorf("keylane: lease %s: %w", k, err)
		}
	}
	return held, nil
}

// DeleteNamespace deletes every stream NamespaceObjects lists for
// namespace, and with them every job, delayed job, dead letter, lease,
// member, result and state entry of it: for good. It refuses with
// core.ErrNamespaceInUse, and deletes nothing, while a worker holds a live
// lease on one of its partitions, unless force is set (the workers then
// fail their next read or write and stop or retry: stop them first). It
// refuses a namespace that does not exist with an error wrapping
// core.ErrNoTopology. It returns the names it deleted; on an error, those
// deleted before it.
func DeleteNamespace(ctx context.Context, js jetstream.JetStream, namespace string, force bool) ([]string, error) {
	objs, err := NamespaceObjects(ctx, js, namespace)
	if err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("keylane: namespace %s has no streams or buckets: %w", namespace, core.ErrNoTopology)
	}
	if !force {
		held, err := LiveLeases(ctx, js, namespace)
		if err != nil {
			return nil, err
		}
		if len(held) > 0 {
			return nil, fmt.Errorf("%w: %s (%d partition leases held, e.g. by %s)", core.ErrNamespaceInUse, namespace, len(held), slices.Sorted(maps.Values(held))[0])
		}
	}
	// The jobs stream last: NamespaceObjects lists the buckets only
	// beside it, so a delete cut short can be run again.
	jobs := Names{Namespace: namespace}.Jobs()
	objs = slices.Clone(objs)
	slices.SortStableFunc(objs, func(a, b string) int {
		switch {
		case a == jobs && b != jobs:
			return 1
		case b == jobs && a != jobs:
			return -1
		}
		return 0
	})
	var deleted []string
	for _, name := range objs {
		dctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
		err := js.DeleteStream(dctx, name)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return deleted, fmt.Errorf("keylane: delete %s: %w", name, err)
		}
		deleted = append(deleted, name)
	}
	slices.Sort(deleted)
	return deleted, nil
}
