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
	Jobs       jetstream.Stream
	Leases     jetstream.KeyValue
	Members    jetstream.KeyValue
	Results    jetstream.KeyValue
	State      jetstream.KeyValue
	// Replicas is the jobs stream's replica count, which every object of
	// the namespace has.
	Replicas int
	// Meta is what the jobs stream's metadata fixes: N, the epoch, the
	// adopted epochs and the reply prefix.
	Meta    Meta
	js      jetstream.JetStream
	nHeader string // Partitions as a Keylane-Partitions header value
}

// NewState returns a State on the namespace's state bucket that ties
// entries to the jobs stream's epoch (see ErrEpoch).
func (t *Topology) NewState() *State {
	s := NewState(t.State)
	s.epoch, s.adopted = t.Meta.Epoch, t.Meta.Adopted
	return s
}

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
	return errors.Is(err, ErrPartitionMismatch) || errors.Is(err, ErrReplicasMismatch) ||
		errors.Is(err, lease.ErrBucketMismatch) || errors.Is(err, lease.ErrInvalidConfig)
}

func setupOnce(ctx context.Context, js jetstream.JetStream, cfg TopologyConfig) (*Topology, error) {
	names := Names{Namespace: cfg.Namespace}
	meta, err := ensureJobs(ctx, js, names, &cfg)
	if err != nil {
		return nil, err
	}
	t := &Topology{Names: names, Partitions: meta.Partitions, Config: cfg, Meta: meta, js: js, nHeader: strconv.Itoa(meta.Partitions)}
	t.Jobs, err = js.Stream(ctx, names.Jobs())
	if err != nil {
		return nil, err
	}
	t.Replicas = t.Jobs.CachedInfo().Config.Replicas
	cfg.Replicas = t.Replicas // everything follows the jobs stream
	t.Config.Replicas = t.Replicas
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
	// Epoch identifies this jobs stream among every stream the namespace
	// ever had: state entries record it, so a key's sequences are compared
	// only with sequences of the same stream.
	Epoch uint64
	// Adopted lists the epochs of earlier jobs streams whose state this one
	// carries on (after a repartition, or an explicit Adopt).
	Adopted []uint64
	// ReplyPrefix is where workers may reply (TopologyConfig.ReplyPrefix).
	ReplyPrefix string
}

// Open reads an existing namespace for a client: it checks the jobs
// stream's metadata and returns it. A non-zero want that differs from the
// stream's partition count is refused with ErrPartitionMismatch.
func Open(ctx context.Context, js jetstream.JetStream, namespace string, want int) (Meta, error) {
	cfg := TopologyConfig{Namespace: namespace, Partitions: want}
	if err := cfg.setDefaults(); err != nil {
		return Meta{}, err
	}
	s, _, err := openJobs(ctx, js, cfg.Namespace)
	if err != nil {
		return Meta{}, err
	}
	return readMeta(s.CachedInfo(), want)
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
func partitionSubjects(ns string, n int) []string {
	subjects := make([]string, n)
	for p := range subjects {
		subjects[p] = partition.Subject(ns, p)
	}
	return subjects
}

func ensureJobs(ctx context.Context, js jetstream.JetStream, names Names, cfg *TopologyConfig) (Meta, error) {
	s, err := js.Stream(ctx, names.Jobs())
	if err == nil {
		info := s.CachedInfo()
		meta, err := readMeta(info, cfg.Partitions)
		if err != nil {
			return Meta{}, err
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
	epoch, err := newEpoch()
	if err != nil {
		return Meta{}, err
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        names.Jobs(),
		Description: "keylane jobs, one subject per partition",
		Subjects:    partitionSubjects(cfg.Namespace, n),
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		Duplicates:  cfg.DuplicateWindow,
		MaxBytes:    cfg.MaxBytes,
		Discard:     jetstream.DiscardNew,
		// Lets clients group-commit jobs in atomic batches.
		AllowAtomicPublish: true,
		Metadata: map[string]string{
			MetaPartitions:  strconv.Itoa(n),
			MetaHash:        partition.HashName,
			MetaVersion:     "2",
			MetaEpoch:       formatEpoch(epoch),
			MetaReplyPrefix: cfg.ReplyPrefix,
		},
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another worker won the race to create it: check what it made.
		return ensureJobs(ctx, js, names, cfg)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("keylane: create jobs stream: %w", err)
	}
	return Meta{Partitions: n, Epoch: epoch, ReplyPrefix: cfg.ReplyPrefix}, nil
}

// upgradeJobs brings a jobs stream made by an older keylane up to date: one
// subject per partition instead of a wildcard, group commit allowed, and
// its epoch written down. Every worker computes the same epoch for an old
// stream (its creation time), so concurrent upgrades agree.
func upgradeJobs(ctx context.Context, js jetstream.JetStream, info *jetstream.StreamInfo, meta Meta, cfg *TopologyConfig) error {
	sc := info.Config
	want := partitionSubjects(cfg.Namespace, meta.Partitions)
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
	m := Meta{Partitions: n, ReplyPrefix: sc.Metadata[MetaReplyPrefix]}
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

// AdoptEpoch makes the namespace's jobs stream carry on the state written
// under an earlier jobs stream's epoch: keys written under it run again
// (their held job IDs still answer retries; their sequences, which mean
// nothing in this stream, are ignored). Use it after a jobs stream was
// deleted and created again, once you know the old stream's jobs are gone
// or re-submitted; workers refuse such keys with ErrEpoch until then.
func AdoptEpoch(ctx context.Context, js jetstream.JetStream, namespace string, epoch uint64) error {
	if epoch == 0 {
		return errors.New("keylane: adopt: epoch 0")
	}
	s, meta, err := openJobs(ctx, js, namespace)
	if err != nil {
		return err
	}
	info := s.CachedInfo()
	if epoch == meta.Epoch || slices.Contains(meta.Adopted, epoch) {
		return nil
	}
	sc := info.Config
	sc.Metadata = maps.Clone(sc.Metadata)
	list := make([]string, 0, len(meta.Adopted)+1)
	for _, e := range append(meta.Adopted, epoch) {
		list = append(list, formatEpoch(e))
	}
	sc.Metadata[MetaAdopted] = strings.Join(list, ",")
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("keylane: adopt epoch %s: %w", formatEpoch(epoch), err)
	}
	return nil
}
