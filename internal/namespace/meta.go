package namespace

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// Meta is what a jobs stream's metadata says about its namespace.
type Meta struct {
	// Partitions is N.
	Partitions int
	// Shards is S, the number of jobs streams of the namespace, and Shard
	// this stream's index among them.
	Shards, Shard int
	// Epoch identifies this jobs stream among every stream the namespace
	// ever had: state entries record it, so a key's sequences are compared
	// only with sequences of the same stream. Every shard has its own (a
	// shard created again gets a new one, like a lone stream).
	Epoch uint64
	// Adopted lists the epochs of earlier jobs streams whose state this one
	// carries on (after a repartition, or an explicit Adopt).
	Adopted []uint64
	// ReplyPrefix is where workers may reply (Config.ReplyPrefix).
	ReplyPrefix string
	// MaxKeyBacklog is the stream's per-key backlog cap (its
	// MaxMsgsPerSubject, refusing new jobs), or 0 for none.
	MaxKeyBacklog int64
	// Delays reports whether the namespace takes delayed jobs: the
	// stream's subjects include its partitions' delay subjects and it
	// sources their due copies from the delays stream.
	Delays bool
	// MaxDeliver is the namespace's WorkerConfig.MaxDeliver, fixed by the
	// first worker that ran it; 0 before any did.
	MaxDeliver int
}

// Metadata keys written into the jobs stream's configuration.
const (
	MetaPartitions = "keylane.partitions"
	MetaHash       = "keylane.hash"
	MetaVersion    = "keylane.version"
	// MetaEpoch identifies the jobs stream (hex); see Meta.Epoch.
	MetaEpoch = "keylane.epoch"
	// MetaAdopted lists adopted epochs (hex, comma-separated).
	MetaAdopted = "keylane.adopted"
	// MetaReplyPrefix is where workers may reply.
	MetaReplyPrefix = "keylane.reply-prefix"
	// MetaShards is S, how many jobs streams the namespace's partitions
	// are spread over; absent means 1.
	MetaShards = "keylane.shards"
	// MetaShard is the stream's own shard index in [0, S); absent means 0.
	MetaShard = "keylane.shard"
)

// SubjectsVersion is the keylane.version (MetaVersion) of a jobs stream
// with per-key subjects, ns.jobs.<p>.<key token>, every job of which is in
// a batch message (the one message format): the jobs stream format
// version. ReadMeta refuses a stream of another version with
// core.ErrOldJobsStream; Setup and Repartition write it. "3" was per-key
// subjects with one-job messages too: such a stream is refused, as its
// one-job messages would be dead-lettered, not run.
const SubjectsVersion = "4"

// OneJobVersion is the keylane.version of a stream whose clients could
// store one-job messages: ReadMeta names the drain for it.
const OneJobVersion = "3"

// MetaMaxDeliver is the jobs stream's metadata key for Meta.MaxDeliver.
const MetaMaxDeliver = "keylane.max-deliver"

// MetaDelays is the jobs stream's metadata key for Meta.Delays; its value
// is DelaysScheme.
const MetaDelays = "keylane.delays"

// DelaysScheme names how delayed jobs travel: "2", schedules in a delays
// stream only workers publish to, whose due copies the jobs stream
// sources. The first scheme kept the schedules in the jobs stream, which
// then had to allow roll-ups and schedule purges (see core.ErrOldJobsStream).
const DelaysScheme = "2"

// Open reads an existing namespace for a client: it checks the metadata
// of every jobs stream shard and returns shard 0's, with the adopted
// epochs of all. A non-zero want that differs from the stream's partition
// count is refused with core.ErrPartitionMismatch.
func Open(ctx context.Context, js jetstream.JetStream, namespace string, want int) (Meta, error) {
	cfg := Config{Namespace: namespace, Partitions: want}
	if err := cfg.SetDefaults(); err != nil {
		return Meta{}, err
	}
	_, metas, err := OpenShards(ctx, js, cfg.Namespace)
	if err != nil {
		return Meta{}, err
	}
	if _, err := CheckMeta(metas[0].Info.Config, want); err != nil {
		return Meta{}, err
	}
	return JoinMeta(metas), nil
}

// JoinMeta is the namespace's Meta from its shards': shard 0's, with the
// epochs every shard adopted.
func JoinMeta(metas []ShardMeta) Meta {
	m := metas[0].Meta
	m.Adopted = nil
	for _, sm := range metas {
		for _, e := range sm.Adopted {
			if !slices.Contains(m.Adopted, e) {
				m.Adopted = append(m.Adopted, e)
			}
		}
	}
	return m
}

// ShardMeta is one shard's Meta and the stream info it was read from.
type ShardMeta struct {
	Meta
	Info *jetstream.StreamInfo
}

// OpenShards opens every jobs stream shard of the namespace and checks
// that they agree; a missing shard is core.ErrNoTopology.
func OpenShards(ctx context.Context, js jetstream.JetStream, namespace string) ([]jetstream.Stream, []ShardMeta, error) {
	s0, m0, err := openJobs(ctx, js, namespace)
	if err != nil {
		return nil, nil, err
	}
	// The namespace's settings are shard 0's: a first stream that claims
	// another index is not the layout its metadata describes.
	if err := sameShards(m0, m0, 0, s0.CachedInfo().Config.Name); err != nil {
		return nil, nil, err
	}
	streams := []jetstream.Stream{s0}
	metas := []ShardMeta{{m0, s0.CachedInfo()}}
	names := Names{Namespace: namespace}
	for i := 1; i < m0.Shards; i++ {
		s, err := js.Stream(ctx, names.JobsShard(i))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil, fmt.Errorf("%w: shard %d of %d (%s) is missing", core.ErrNoTopology, i, m0.Shards, names.JobsShard(i))
		}
		if err != nil {
			return nil, nil, err
		}
		if err := foreignJobsStream(s.CachedInfo().Config, namespace); err != nil {
			return nil, nil, err
		}
		m, err := ReadMeta(s.CachedInfo(), m0.Partitions)
		if err == nil {
			err = sameShards(m0, m, i, s.CachedInfo().Config.Name)
		}
		if err != nil {
			return nil, nil, err
		}
		streams = append(streams, s)
		metas = append(metas, ShardMeta{m, s.CachedInfo()})
	}
	return streams, metas, nil
}

// sameShards checks that shard i's metadata agrees with shard 0's.
func sameShards(m0, m Meta, i int, name string) error {
	if m.Shards != m0.Shards || m.Shard != i {
		return fmt.Errorf("%w: stream %s says shard %d of %d, expected shard %d of %d", core.ErrShardsMismatch, name, m.Shard, m.Shards, i, m0.Shards)
	}
	if m.ReplyPrefix != m0.ReplyPrefix {
		return fmt.Errorf("%w: stream %s has reply prefix %q, shard 0 %q", core.ErrShardsMismatch, name, m.ReplyPrefix, m0.ReplyPrefix)
	}
	return nil
}

// openJobs opens the namespace's jobs stream and reads its metadata; a
// missing stream is core.ErrNoTopology.
func openJobs(ctx context.Context, js jetstream.JetStream, namespace string) (jetstream.Stream, Meta, error) {
	s, err := js.Stream(ctx, Names{Namespace: namespace}.Jobs())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, Meta{}, &core.NoTopologyError{Namespace: namespace}
	}
	if err != nil {
		return nil, Meta{}, err
	}
	if err := foreignJobsStream(s.CachedInfo().Config, namespace); err != nil {
		return nil, Meta{}, err
	}
	meta, err := ReadMeta(s.CachedInfo(), 0)
	if err != nil {
		return nil, Meta{}, err
	}
	return s, meta, nil
}

// foreignJobsStream refuses jobs stream sc, found under namespace's name,
// when it takes another namespace's subjects: namespaces whose names
// differ only in '-' and '_' share object names (Names), and one must
// neither use nor change the other's streams (Setup would give them its
// own subjects). It wraps core.ErrNoTopology: namespace is not set up.
func foreignJobsStream(sc jetstream.StreamConfig, namespace string) error {
	for _, subj := range sc.Subjects {
		if !strings.HasPrefix(subj, namespace+".") {
			return &foreignStreamError{namespace: namespace, stream: sc.Name, subject: subj}
		}
	}
	return nil
}

type foreignStreamError struct{ namespace, stream, subject string }

func (e *foreignStreamError) Error() string {
	return fmt.Sprintf("keylane: namespace %s is not set up: the stream named for its jobs, %s, takes subject %s, another namespace's (names that differ only in '-' and '_' share object names); use another namespace name", e.namespace, e.stream, e.subject)
}

func (e *foreignStreamError) Unwrap() error { return core.ErrNoTopology }

func newEpoch() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("keylane: epoch: %w", err)
		}
		if e := binary.BigEndian.Uint64(b[:]); e != 0 {
			return e, nil
		}
	}
}

func FormatEpoch(e uint64) string { return strconv.FormatUint(e, 16) }

func ReadMeta(info *jetstream.StreamInfo, want int) (Meta, error) {
	sc := info.Config
	n, err := CheckMeta(sc, want)
	if err != nil {
		return Meta{}, err
	}
	v := sc.Metadata[MetaVersion]
	if v == OneJobVersion {
		return Meta{}, fmt.Errorf("%w: stream %s has %s %q: it was made by a keylane whose clients store one-job messages, which this keylane's workers refuse (dead-letter) instead of running; drain it with the keylane that made it (its workers running, no client sending), then delete it (nats stream rm %s), or use another namespace", core.ErrOldJobsStream, sc.Name, MetaVersion, v, sc.Name)
	}
	if v != SubjectsVersion {
		return Meta{}, fmt.Errorf("%w: stream %s has %s %q and subjects %v; drain it with the keylane that made it, then delete it (nats stream rm %s), or use another namespace", core.ErrOldJobsStream, sc.Name, MetaVersion, v, sc.Subjects, sc.Name)
	}
	if sc.AllowMsgSchedules || sc.AllowRollup {
		// The first delays scheme: schedules in the jobs stream, which then
		// allowed roll-ups, so a raw publisher could delete queued jobs.
		return Meta{}, fmt.Errorf("%w: stream %s allows message schedules or roll-ups (delayed jobs of an earlier keylane, kept in the jobs stream, where a raw publisher could delete queued jobs); drain it with the keylane that made it, then delete it (nats stream rm %s), or use another namespace", core.ErrOldJobsStream, sc.Name, sc.Name)
	}
	m := Meta{Partitions: n, Shards: 1, ReplyPrefix: sc.Metadata[MetaReplyPrefix], MaxKeyBacklog: keyBacklog(sc), Delays: sc.Metadata[MetaDelays] == DelaysScheme}
	if v, ok := sc.Metadata[MetaShards]; ok {
		s, err := strconv.Atoi(v)
		i, ierr := strconv.Atoi(sc.Metadata[MetaShard])
		if err != nil || ierr != nil || s < 1 || s > min(n, MaxStreamShards) || i < 0 || i >= s {
			return Meta{}, fmt.Errorf("%w: stream %s has bad shard metadata (%s %q, %s %q)", core.ErrShardsMismatch, sc.Name, MetaShards, v, MetaShard, sc.Metadata[MetaShard])
		}
		m.Shards, m.Shard = s, i
	}
	if m.ReplyPrefix == "" {
		m.ReplyPrefix = core.DefaultReplyPrefix
	}
	if v, ok := sc.Metadata[MetaMaxDeliver]; ok {
		if m.MaxDeliver, err = strconv.Atoi(v); err != nil || m.MaxDeliver < 1 {
			return Meta{}, fmt.Errorf("%w: stream %s has a bad %s %q", core.ErrMaxDeliverMismatch, sc.Name, MetaMaxDeliver, v)
		}
	}
	if v, ok := sc.Metadata[MetaEpoch]; ok {
		if m.Epoch, err = strconv.ParseUint(v, 16, 64); err != nil || m.Epoch == 0 {
			return Meta{}, fmt.Errorf("%w: stream %s has a bad %s %q", core.ErrPartitionMismatch, sc.Name, MetaEpoch, v)
		}
	} else {
		m.Epoch = uint64(info.Created.UnixNano())
	}
	for _, v := range strings.FieldsFunc(sc.Metadata[MetaAdopted], func(r rune) bool { return r == ',' }) {
		e, err := strconv.ParseUint(v, 16, 64)
		if err != nil {
			return Meta{}, fmt.Errorf("%w: stream %s has a bad %s %q", core.ErrPartitionMismatch, sc.Name, MetaAdopted, v)
		}
		m.Adopted = append(m.Adopted, e)
	}
	return m, nil
}

// keyBacklog is a jobs stream's per-key backlog cap, or 0.
func keyBacklog(sc jetstream.StreamConfig) int64 {
	if sc.DiscardNewPerSubject && sc.MaxMsgsPerSubject > 0 {
		return sc.MaxMsgsPerSubject
	}
	return 0
}

func CheckMeta(sc jetstream.StreamConfig, want int) (int, error) {
	n, err := strconv.Atoi(sc.Metadata[MetaPartitions])
	if err != nil || partition.ValidateCount(n) != nil {
		return 0, fmt.Errorf("%w: stream %s has no valid %s metadata (%q)", core.ErrPartitionMismatch, sc.Name, MetaPartitions, sc.Metadata[MetaPartitions])
	}
	if h := sc.Metadata[MetaHash]; h != partition.HashName {
		return 0, fmt.Errorf("%w: stream %s uses hash %q, this client uses %q", core.ErrPartitionMismatch, sc.Name, h, partition.HashName)
	}
	if want != 0 && want != n {
		return 0, fmt.Errorf("%w: stream %s has %d partitions, configured %d", core.ErrPartitionMismatch, sc.Name, n, want)
	}
	return n, nil
}

// AdoptEpoch makes the namespace's jobs streams carry on the state written
// under an earlier jobs stream's epoch: keys written under it run again
// (their held job IDs still answer retries; their sequences, which mean
// nothing in this stream, are ignored). Use it after a jobs stream (or a
// shard of it) was deleted and created again, once you know the old
// stream's jobs are gone or re-submitted; workers refuse such keys with
// core.ErrEpoch until then. The epoch is written into every shard.
func AdoptEpoch(ctx context.Context, js jetstream.JetStream, namespace string, epoch uint64) error {
	if epoch == 0 {
		return errors.New("keylane: adopt: epoch 0")
	}
	_, metas, err := OpenShards(ctx, js, namespace)
	if err != nil {
		return err
	}
	for _, m := range metas {
		if epoch == m.Epoch {
			return nil // a live stream's own epoch: nothing to carry over
		}
	}
	for _, m := range metas {
		if slices.Contains(m.Adopted, epoch) {
			continue
		}
		sc := m.Info.Config
		sc.Metadata = maps.Clone(sc.Metadata)
		list := make([]string, 0, len(m.Adopted)+1)
		for _, e := range append(m.Adopted, epoch) {
			list = append(list, FormatEpoch(e))
		}
		sc.Metadata[MetaAdopted] = strings.Join(list, ",")
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("keylane: adopt epoch %s on %s: %w", FormatEpoch(epoch), sc.Name, err)
		}
	}
	return nil
}
