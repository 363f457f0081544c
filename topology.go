package keylane

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxStreamShards bounds TopologyConfig.StreamShards.
const MaxStreamShards = 64

var namespaceRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// TopologyConfig describes the streams, consumers and buckets of a namespace.
type TopologyConfig struct {
	// Namespace prefixes every subject and object name. Defaults to "keylane".
	Namespace string
	// Partitions is N, the number of partitions. Zero means "whatever the
	// existing stream says"; when the stream does not exist, it defaults to 16.
	// A non-zero value that differs from the stream's is refused with
	// ErrPartitionMismatch.
	Partitions int
	// StreamShards is S, how many jobs streams the partitions are spread
	// over, so that S stream leaders (on different servers of a cluster)
	// share the storage work: partition p lives in shard p % S. Zero means
	// "whatever the existing namespace has", and 1 when it is created: one
	// stream named as before (see doc.go, "Shards"). A non-zero value that
	// differs from the namespace's is refused with ErrShardsMismatch. At
	// most the partition count and MaxStreamShards; a multiple of S as
	// the partition count gives every shard the same share.
	StreamShards int
	// Replicas of every stream and bucket. Zero means "whatever the
	// existing jobs stream has", and 1 when it is created (embedded
	// server); use 3 on a cluster. A non-zero value that differs from an
	// existing object's is refused with ErrReplicasMismatch.
	Replicas int
	// DuplicateWindow is how long the server remembers job IDs to drop
	// duplicate submits. Defaults to 2 minutes; never less than 2 minutes.
	DuplicateWindow time.Duration
	// LeaseTTL is the TTL of partition leases and member entries. Defaults
	// to 10s.
	LeaseTTL time.Duration
	// ResultsTTL is how long stored results live. Defaults to 1 hour.
	ResultsTTL time.Duration
	// MaxBytes bounds the jobs stream's size; -1 is unlimited. Defaults to -1.
	MaxBytes int64
	// ReplyPrefix is the only subject prefix workers reply to: clients
	// take their inboxes under it, and a job naming a reply subject outside
	// it (or a wildcard) is dead-lettered as malformed, so whoever may
	// submit a job cannot make workers publish elsewhere with their
	// permissions. Fixed in the jobs stream's metadata when it is created.
	// Defaults to "_INBOX.".
	ReplyPrefix string
}

func (c *TopologyConfig) setDefaults() error {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if !namespaceRE.MatchString(c.Namespace) {
		return fmt.Errorf("keylane: namespace %q must match %s", c.Namespace, namespaceRE)
	}
	if c.Partitions != 0 {
		if err := partition.ValidateCount(c.Partitions); err != nil {
			return err
		}
	}
	if c.StreamShards < 0 || c.StreamShards > MaxStreamShards {
		return fmt.Errorf("keylane: stream shards must be 1..%d, got %d", MaxStreamShards, c.StreamShards)
	}
	if c.Partitions != 0 && c.StreamShards > c.Partitions {
		return fmt.Errorf("keylane: %d stream shards for %d partitions: every shard needs a partition", c.StreamShards, c.Partitions)
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("keylane: replicas must be 1..5, got %d", c.Replicas)
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.DuplicateWindow < MinDuplicateWindow {
		return fmt.Errorf("keylane: duplicate window %s is below the %s minimum", c.DuplicateWindow, MinDuplicateWindow)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LeaseTTL < MinLeaseTTL {
		return fmt.Errorf("keylane: lease TTL %s is below %s", c.LeaseTTL, MinLeaseTTL)
	}
	if c.ResultsTTL == 0 {
		c.ResultsTTL = DefaultResultsTTL
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = -1
	}
	if c.ReplyPrefix == "" {
		c.ReplyPrefix = DefaultReplyPrefix
	}
	if err := validReplyPrefix(c.ReplyPrefix, c.Namespace); err != nil {
		return err
	}
	return nil
}

// validReplyPrefix refuses reply prefixes that would let a job steer a
// worker's reply into the server's APIs or keylane's own subjects.
func validReplyPrefix(prefix, ns string) error {
	bad := !strings.HasSuffix(prefix, ".") || strings.HasPrefix(prefix, "$") ||
		strings.HasPrefix(prefix, ns+".") || strings.ContainsAny(prefix, "*> \t\r\n") || strings.Contains(prefix, "..") || prefix[0] == '.'
	if bad {
		return fmt.Errorf("keylane: reply prefix %q must end with '.', hold no wildcard or space, and not start with '$' or the namespace %q", prefix, ns+".")
	}
	return nil
}

// validReply reports whether a job's reply subject is a plain subject under
// the topology's reply prefix.
func validReply(reply, prefix string) bool {
	if len(reply) <= len(prefix) || !strings.HasPrefix(reply, prefix) {
		return false
	}
	for _, tok := range strings.Split(reply[len(prefix):], ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return false
		}
	}
	return true
}

// Topology is the set of NATS objects of one namespace, opened or created.
type Topology struct {
	Names      Names
	Partitions int
	Config     TopologyConfig
	// Jobs is the jobs stream of shard 0, the namespace's first: with one
	// shard, the only one.
	Jobs jetstream.Stream
	// Shards is S, the number of jobs streams; Streams and Epochs hold
	// each shard's stream and epoch, by shard index.
	Shards  int
	Streams []jetstream.Stream
	Epochs  []uint64
	Leases  jetstream.KeyValue
	Members jetstream.KeyValue
	Results jetstream.KeyValue
	State   jetstream.KeyValue
	// Replicas is the jobs stream's replica count, which every object of
	// the namespace has.
	Replicas int
	// Meta is what the jobs streams' metadata fixes: N, S, shard 0's
	// epoch, the adopted epochs (of every shard) and the reply prefix.
	Meta    Meta
	js      jetstream.JetStream
	nHeader string // Partitions as a Keylane-Partitions header value
}

// NewState returns a State on the namespace's state bucket that ties
// entries to the epoch of their key's jobs stream shard (see ErrEpoch).
func (t *Topology) NewState() *State {
	s := NewState(t.State)
	s.epochs, s.adopted = slices.Clone(t.Epochs), t.Meta.Adopted
	return s
}

// ShardOf returns the jobs stream shard that holds partition p among s
// shards: p % s. Striding (rather than ranges) needs no table, gives every
// shard ⌊N/S⌋ or ⌈N/S⌉ partitions for any N, and spreads neighbouring
// partitions over different stream leaders.
func ShardOf(p, s int) int { return p % s }

// StreamOf returns the jobs stream that holds partition p.
func (t *Topology) StreamOf(p int) jetstream.Stream { return t.Streams[ShardOf(p, t.Shards)] }

// EpochOf returns the epoch of the jobs stream that holds partition p.
func (t *Topology) EpochOf(p int) uint64 { return t.Epochs[ShardOf(p, t.Shards)] }

// Setup creates, or opens and checks, everything a namespace needs: the jobs
// stream, the dead-letter stream and the leases, members, results and state
// buckets. It is idempotent and safe to run from many workers at once: each
// attempt bounds every request (setupAttemptTimeout), and an attempt that
// fails for any reason but a mismatch (partition count, replicas, bucket
// settings, bad config) is made again with backoff until ctx ends; an
// object a concurrent creator made is opened and checked. The
// per-partition consumers are made by the partition owner when it takes
// the lease.
func Setup(ctx context.Context, js jetstream.JetStream, cfg TopologyConfig) (*Topology, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	pause := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, setupAttemptTimeout)
		t, err := setupOnce(actx, js, cfg)
		cancel()
		if err == nil || permanentSetupError(err) {
			return t, err
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("keylane: setup of namespace %s: %w (last attempt: %w)", cfg.Namespace, ctx.Err(), err)
		case <-timer.C:
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// setupAttemptTimeout bounds one attempt of Setup. A cluster that is
// electing leaders, or a create racing another creator's, may not answer
// one request; the next attempt finds what the other made.
const setupAttemptTimeout = 5 * time.Second

func permanentSetupError(err error) bool {
	return errors.Is(err, ErrPartitionMismatch) || errors.Is(err, ErrReplicasMismatch) || errors.Is(err, ErrShardsMismatch) ||
		errors.Is(err, lease.ErrBucketMismatch) || errors.Is(err, lease.ErrInvalidConfig)
}

func setupOnce(ctx context.Context, js jetstream.JetStream, cfg TopologyConfig) (*Topology, error) {
	names := Names{Namespace: cfg.Namespace}
	streams, metas, err := ensureShards(ctx, js, names, &cfg)
	if err != nil {
		return nil, err
	}
	meta := joinMeta(metas)
	t := &Topology{Names: names, Partitions: meta.Partitions, Config: cfg, Meta: meta, js: js, nHeader: strconv.Itoa(meta.Partitions)}
	t.Jobs, t.Streams, t.Shards = streams[0], streams, meta.Shards
	for _, m := range metas {
		t.Epochs = append(t.Epochs, m.Epoch)
	}
	t.Replicas = t.Jobs.CachedInfo().Config.Replicas
	cfg.Replicas = t.Replicas // everything follows the jobs stream
	t.Config.Replicas = t.Replicas
	t.Config.StreamShards = t.Shards
	if err := ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        names.Dead(),
		Description: "keylane dead letters: the original job plus error headers",
		Subjects:    []string{partition.DeadWildcard(cfg.Namespace)},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      7 * 24 * time.Hour,
	}); err != nil {
		return nil, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	if t.Leases, err = lease.EnsureBucket(ctx, js, lease.BucketConfig{Name: names.Leases(), TTL: cfg.LeaseTTL, Replicas: cfg.Replicas}); err != nil {
		return nil, err
	}
	if t.Members, err = lease.EnsureBucket(ctx, js, lease.BucketConfig{Name: names.Members(), TTL: cfg.LeaseTTL, Replicas: cfg.Replicas}); err != nil {
		return nil, err
	}
	if t.Results, err = ensureBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: names.Results(), Description: "keylane job results by job ID",
		TTL: cfg.ResultsTTL, History: 1, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	}); err != nil {
		return nil, err
	}
	if t.State, err = ensureBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: names.State(), Description: "keylane per-key state, written with CAS, sequence and fence",
		History: 1, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	}); err != nil {
		return nil, err
	}
	for _, b := range []string{names.Leases(), names.Members(), names.Results(), names.State()} {
		if err := checkReplicas(ctx, js, "KV_"+b, cfg.Replicas); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// ensureStream creates a stream, or checks an existing one's replicas.
func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) error {
	_, err := js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return checkReplicas(ctx, js, sc.Name, sc.Replicas)
	}
	return err
}

// checkReplicas refuses an existing stream with another replica count.
func checkReplicas(ctx context.Context, js jetstream.JetStream, name string, want int) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	if got := s.CachedInfo().Config.Replicas; got != want {
		return fmt.Errorf("%w: %s has %d replicas, the namespace %d (configure Replicas %d, or 0 to follow it)", ErrReplicasMismatch, name, got, want, got)
	}
	return nil
}

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
	// ReplyPrefix is where workers may reply (TopologyConfig.ReplyPrefix).
	ReplyPrefix string
}

// Open reads an existing namespace for a client: it checks the metadata
// of every jobs stream shard and returns shard 0's, with the adopted
// epochs of all. A non-zero want that differs from the stream's partition
// count is refused with ErrPartitionMismatch.
func Open(ctx context.Context, js jetstream.JetStream, namespace string, want int) (Meta, error) {
	cfg := TopologyConfig{Namespace: namespace, Partitions: want}
	if err := cfg.setDefaults(); err != nil {
		return Meta{}, err
	}
	_, metas, err := openShards(ctx, js, cfg.Namespace)
	if err != nil {
		return Meta{}, err
	}
	if _, err := checkMeta(metas[0].info.Config, want); err != nil {
		return Meta{}, err
	}
	return joinMeta(metas), nil
}

// joinMeta is the namespace's Meta from its shards': shard 0's, with the
// epochs every shard adopted.
func joinMeta(metas []shardMeta) Meta {
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

// shardMeta is one shard's Meta and the stream info it was read from.
type shardMeta struct {
	Meta
	info *jetstream.StreamInfo
}

// openShards opens every jobs stream shard of the namespace and checks
// that they agree; a missing shard is ErrNoTopology.
func openShards(ctx context.Context, js jetstream.JetStream, namespace string) ([]jetstream.Stream, []shardMeta, error) {
	s0, m0, err := openJobs(ctx, js, namespace)
	if err != nil {
		return nil, nil, err
	}
	streams := []jetstream.Stream{s0}
	metas := []shardMeta{{m0, s0.CachedInfo()}}
	names := Names{Namespace: namespace}
	for i := 1; i < m0.Shards; i++ {
		s, err := js.Stream(ctx, names.JobsShard(i))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil, fmt.Errorf("%w: shard %d of %d (%s) is missing", ErrNoTopology, i, m0.Shards, names.JobsShard(i))
		}
		if err != nil {
			return nil, nil, err
		}
		m, err := readMeta(s.CachedInfo(), m0.Partitions)
		if err == nil {
			err = sameShards(m0, m, i, s.CachedInfo().Config.Name)
		}
		if err != nil {
			return nil, nil, err
		}
		streams = append(streams, s)
		metas = append(metas, shardMeta{m, s.CachedInfo()})
	}
	return streams, metas, nil
}

// sameShards checks that shard i's metadata agrees with shard 0's.
func sameShards(m0, m Meta, i int, name string) error {
	if m.Shards != m0.Shards || m.Shard != i {
		return fmt.Errorf("%w: stream %s says shard %d of %d, expected shard %d of %d", ErrShardsMismatch, name, m.Shard, m.Shards, i, m0.Shards)
	}
	if m.ReplyPrefix != m0.ReplyPrefix {
		return fmt.Errorf("%w: stream %s has reply prefix %q, shard 0 %q", ErrShardsMismatch, name, m.ReplyPrefix, m0.ReplyPrefix)
	}
	return nil
}

// openJobs opens the namespace's jobs stream and reads its metadata; a
// missing stream is ErrNoTopology.
func openJobs(ctx context.Context, js jetstream.JetStream, namespace string) (jetstream.Stream, Meta, error) {
	s, err := js.Stream(ctx, Names{Namespace: namespace}.Jobs())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, Meta{}, ErrNoTopology
	}
	if err != nil {
		return nil, Meta{}, err
	}
	meta, err := readMeta(s.CachedInfo(), 0)
	if err != nil {
		return nil, Meta{}, err
	}
	return s, meta, nil
}

// partitionSubjects lists the jobs stream's subjects: exactly one per
// partition, so a publish to anything else (another N's partition, a typo)
// is refused by the server instead of stored where no consumer reads it.
func partitionSubjects(ns string, n int) []string { return shardSubjects(ns, n, 1, 0) }

// shardSubjects lists the subjects of jobs stream shard i of s: those of
// its partitions only, so the subject decides the shard.
func shardSubjects(ns string, n, s, i int) []string {
	subjects := make([]string, 0, (n+s-1)/s)
	for p := i; p < n; p += s {
		subjects = append(subjects, partition.Subject(ns, p))
	}
	return subjects
}

// ensureShards creates, or opens and checks, every jobs stream shard:
// shard 0 first (it fixes N, S, the replicas and the reply prefix), then
// the others after its example. A missing shard is created with an epoch
// of its own, so a shard deleted and created again is told apart from
// the one it replaced, exactly as a lone jobs stream is.
func ensureShards(ctx context.Context, js jetstream.JetStream, names Names, cfg *TopologyConfig) ([]jetstream.Stream, []shardMeta, error) {
	m0, err := ensureJobs(ctx, js, names, cfg)
	if err != nil {
		return nil, nil, err
	}
	s0, err := js.Stream(ctx, names.Jobs())
	if err != nil {
		return nil, nil, err
	}
	streams := []jetstream.Stream{s0}
	metas := []shardMeta{{m0, s0.CachedInfo()}}
	for i := 1; i < m0.Shards; i++ {
		s, m, err := ensureShard(ctx, js, names, s0.CachedInfo(), m0, i)
		if err != nil {
			return nil, nil, err
		}
		streams = append(streams, s)
		metas = append(metas, shardMeta{m, s.CachedInfo()})
	}
	return streams, metas, nil
}

// ensureShard creates, or opens and checks, jobs stream shard i > 0 after
// the example of shard 0 (info, m0).
func ensureShard(ctx context.Context, js jetstream.JetStream, names Names, info0 *jetstream.StreamInfo, m0 Meta, i int) (jetstream.Stream, Meta, error) {
	name := names.JobsShard(i)
	for attempt := 0; ; attempt++ {
		s, err := js.Stream(ctx, name)
		if err == nil {
			info := s.CachedInfo()
			m, err := readMeta(info, m0.Partitions)
			if err == nil {
				err = sameShards(m0, m, i, name)
			}
			if err != nil {
				return nil, Meta{}, err
			}
			if info.Config.Replicas != info0.Config.Replicas {
				return nil, Meta{}, fmt.Errorf("%w: jobs stream %s has %d replicas, shard 0 %d", ErrReplicasMismatch, name, info.Config.Replicas, info0.Config.Replicas)
			}
			cfg := TopologyConfig{Namespace: names.Namespace}
			if err := upgradeJobs(ctx, js, info, m, &cfg); err != nil {
				return nil, Meta{}, err
			}
			return s, m, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) || attempt > 0 {
			return nil, Meta{}, err
		}
		epoch, err := newEpoch()
		if err != nil {
			return nil, Meta{}, err
		}
		sc := info0.Config
		sc.Name = name
		sc.Subjects = shardSubjects(names.Namespace, m0.Partitions, m0.Shards, i)
		sc.Metadata = maps.Clone(sc.Metadata)
		sc.Metadata[MetaShard] = strconv.Itoa(i)
		sc.Metadata[MetaEpoch] = formatEpoch(epoch)
		sc.FirstSeq = 0
		sc.Sources, sc.Mirror, sc.Placement = nil, nil, nil
		_, err = js.CreateStream(ctx, sc)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, Meta{}, fmt.Errorf("keylane: create jobs stream %s: %w", name, err)
		}
		// Created, or another worker won the race: open and check it.
	}
}

func ensureJobs(ctx context.Context, js jetstream.JetStream, names Names, cfg *TopologyConfig) (Meta, error) {
	s, err := js.Stream(ctx, names.Jobs())
	if err == nil {
		info := s.CachedInfo()
		meta, err := readMeta(info, cfg.Partitions)
		if err != nil {
			return Meta{}, err
		}
		if meta.Shard != 0 {
			return Meta{}, fmt.Errorf("%w: stream %s says it is shard %d", ErrShardsMismatch, info.Config.Name, meta.Shard)
		}
		if cfg.StreamShards != 0 && meta.Shards != cfg.StreamShards {
			return Meta{}, fmt.Errorf("%w: namespace %s has %d jobs stream shards, configured %d (configure %d, or 0 to follow it)", ErrShardsMismatch, cfg.Namespace, meta.Shards, cfg.StreamShards, meta.Shards)
		}
		if cfg.Replicas != 0 && info.Config.Replicas != cfg.Replicas {
			return Meta{}, fmt.Errorf("%w: jobs stream %s has %d replicas, configured %d (configure %d, or 0 to follow it)", ErrReplicasMismatch, info.Config.Name, info.Config.Replicas, cfg.Replicas, info.Config.Replicas)
		}
		return meta, upgradeJobs(ctx, js, info, meta, cfg)
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return Meta{}, err
	}
	n := cfg.Partitions
	if n == 0 {
		n = DefaultPartitions
	}
	replicas := cfg.Replicas
	if replicas == 0 {
		replicas = 1
	}
	shards := max(cfg.StreamShards, 1)
	if shards > n {
		return Meta{}, fmt.Errorf("%w: %d stream shards for %d partitions: every shard needs a partition", ErrShardsMismatch, shards, n)
	}
	md := map[string]string{
		MetaPartitions:  strconv.Itoa(n),
		MetaHash:        partition.HashName,
		MetaVersion:     "2",
		MetaReplyPrefix: cfg.ReplyPrefix,
	}
	if shards > 1 {
		// One shard keeps today's metadata, which older clients read.
		md[MetaShards], md[MetaShard] = strconv.Itoa(shards), "0"
	}
	epoch, err := newEpoch()
	if err != nil {
		return Meta{}, err
	}
	md[MetaEpoch] = formatEpoch(epoch)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        names.Jobs(),
		Description: "keylane jobs, one subject per partition",
		Subjects:    shardSubjects(cfg.Namespace, n, shards, 0),
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		Duplicates:  cfg.DuplicateWindow,
		MaxBytes:    cfg.MaxBytes,
		Discard:     jetstream.DiscardNew,
		// Lets clients group-commit jobs in atomic batches.
		AllowAtomicPublish: true,
		Metadata:           md,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another worker won the race to create it: check what it made.
		return ensureJobs(ctx, js, names, cfg)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("keylane: create jobs stream: %w", err)
	}
	return Meta{Partitions: n, Shards: shards, Epoch: epoch, ReplyPrefix: cfg.ReplyPrefix}, nil
}

// upgradeJobs brings a jobs stream made by an older keylane up to date: one
// subject per partition instead of a wildcard, group commit allowed, and
// its epoch written down. Every worker computes the same epoch for an old
// stream (its creation time), so concurrent upgrades agree.
func upgradeJobs(ctx context.Context, js jetstream.JetStream, info *jetstream.StreamInfo, meta Meta, cfg *TopologyConfig) error {
	sc := info.Config
	want := shardSubjects(cfg.Namespace, meta.Partitions, meta.Shards, meta.Shard)
	_, hasEpoch := sc.Metadata[MetaEpoch]
	if slices.Equal(sc.Subjects, want) && sc.AllowAtomicPublish && hasEpoch {
		return nil
	}
	sc.Subjects = want
	// A server before 2.12 refuses atomic publish; clients then fall back
	// to single publishes.
	sc.AllowAtomicPublish = true
	sc.Metadata = maps.Clone(sc.Metadata)
	if !hasEpoch {
		sc.Metadata[MetaEpoch] = formatEpoch(meta.Epoch)
	}
	if _, ok := sc.Metadata[MetaReplyPrefix]; !ok {
		sc.Metadata[MetaReplyPrefix] = meta.ReplyPrefix
	}
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		sc.AllowAtomicPublish = false
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("keylane: upgrade jobs stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

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

func formatEpoch(e uint64) string { return strconv.FormatUint(e, 16) }

func readMeta(info *jetstream.StreamInfo, want int) (Meta, error) {
	sc := info.Config
	n, err := checkMeta(sc, want)
	if err != nil {
		return Meta{}, err
	}
	m := Meta{Partitions: n, Shards: 1, ReplyPrefix: sc.Metadata[MetaReplyPrefix]}
	if v, ok := sc.Metadata[MetaShards]; ok {
		s, err := strconv.Atoi(v)
		i, ierr := strconv.Atoi(sc.Metadata[MetaShard])
		if err != nil || ierr != nil || s < 1 || s > min(n, MaxStreamShards) || i < 0 || i >= s {
			return Meta{}, fmt.Errorf("%w: stream %s has bad shard metadata (%s %q, %s %q)", ErrShardsMismatch, sc.Name, MetaShards, v, MetaShard, sc.Metadata[MetaShard])
		}
		m.Shards, m.Shard = s, i
	}
	if m.ReplyPrefix == "" {
		m.ReplyPrefix = "_INBOX."
	}
	if v, ok := sc.Metadata[MetaEpoch]; ok {
		if m.Epoch, err = strconv.ParseUint(v, 16, 64); err != nil || m.Epoch == 0 {
			return Meta{}, fmt.Errorf("%w: stream %s has a bad %s %q", ErrPartitionMismatch, sc.Name, MetaEpoch, v)
		}
	} else {
		m.Epoch = uint64(info.Created.UnixNano())
	}
	for _, v := range strings.FieldsFunc(sc.Metadata[MetaAdopted], func(r rune) bool { return r == ',' }) {
		e, err := strconv.ParseUint(v, 16, 64)
		if err != nil {
			return Meta{}, fmt.Errorf("%w: stream %s has a bad %s %q", ErrPartitionMismatch, sc.Name, MetaAdopted, v)
		}
		m.Adopted = append(m.Adopted, e)
	}
	return m, nil
}

func checkMeta(sc jetstream.StreamConfig, want int) (int, error) {
	n, err := strconv.Atoi(sc.Metadata[MetaPartitions])
	if err != nil || partition.ValidateCount(n) != nil {
		return 0, fmt.Errorf("%w: stream %s has no valid %s metadata (%q)", ErrPartitionMismatch, sc.Name, MetaPartitions, sc.Metadata[MetaPartitions])
	}
	if h := sc.Metadata[MetaHash]; h != partition.HashName {
		return 0, fmt.Errorf("%w: stream %s uses hash %q, this client uses %q", ErrPartitionMismatch, sc.Name, h, partition.HashName)
	}
	if want != 0 && want != n {
		return 0, fmt.Errorf("%w: stream %s has %d partitions, configured %d", ErrPartitionMismatch, sc.Name, n, want)
	}
	return n, nil
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, err
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("keylane: create bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// consumerConfig is the durable pull consumer of one partition.
func (t *Topology) consumerConfig(p int, ackWait time.Duration, maxAckPending int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       t.Names.Consumer(p),
		Description:   "keylane partition " + strconv.Itoa(p),
		FilterSubject: partition.Subject(t.Names.Namespace, p),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		// keylane counts attempts itself and dead-letters in place; the
		// server must never silently stop delivering a job.
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas:      t.Replicas,
	}
}

// AdoptEpoch makes the namespace's jobs streams carry on the state written
// under an earlier jobs stream's epoch: keys written under it run again
// (their held job IDs still answer retries; their sequences, which mean
// nothing in this stream, are ignored). Use it after a jobs stream (or a
// shard of it) was deleted and created again, once you know the old
// stream's jobs are gone or re-submitted; workers refuse such keys with
// ErrEpoch until then. The epoch is written into every shard.
func AdoptEpoch(ctx context.Context, js jetstream.JetStream, namespace string, epoch uint64) error {
	if epoch == 0 {
		return errors.New("keylane: adopt: epoch 0")
	}
	_, metas, err := openShards(ctx, js, namespace)
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
		sc := m.info.Config
		sc.Metadata = maps.Clone(sc.Metadata)
		list := make([]string, 0, len(m.Adopted)+1)
		for _, e := range append(m.Adopted, epoch) {
			list = append(list, formatEpoch(e))
		}
		sc.Metadata[MetaAdopted] = strings.Join(list, ",")
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("keylane: adopt epoch %s on %s: %w", formatEpoch(epoch), sc.Name, err)
		}
	}
	return nil
}
