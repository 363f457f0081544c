package jetstream

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrPartitionMismatch is returned when the jobs stream was created with a
// different partition count or hash than the caller expects. Jobs routed with
// another N would land on the wrong partition and break per-key exclusion, so
// keylane refuses to run rather than guess.
var ErrPartitionMismatch = errors.New("keylane: partition count or hash differs from the jobs stream")

// ErrNoTopology is returned when a client opens a namespace whose jobs
// stream does not exist yet and was not asked to create it.
var ErrNoTopology = errors.New("keylane: jobs stream not found (start a worker first, or set Partitions to create it)")

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
	// Replicas of every stream and bucket. Defaults to 1 (embedded server);
	// use 3 on a cluster.
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
}

func (c *TopologyConfig) setDefaults() error {
	if c.Namespace == "" {
		c.Namespace = "keylane"
	}
	if !namespaceRE.MatchString(c.Namespace) {
		return fmt.Errorf("keylane: namespace %q must match %s", c.Namespace, namespaceRE)
	}
	if c.Partitions != 0 {
		if err := partition.ValidateCount(c.Partitions); err != nil {
			return err
		}
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return fmt.Errorf("keylane: replicas must be 1..5, got %d", c.Replicas)
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.DuplicateWindow < 2*time.Minute {
		return fmt.Errorf("keylane: duplicate window %s is below the 2m minimum", c.DuplicateWindow)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.LeaseTTL < 300*time.Millisecond {
		return fmt.Errorf("keylane: lease TTL %s is below 300ms", c.LeaseTTL)
	}
	if c.ResultsTTL == 0 {
		c.ResultsTTL = time.Hour
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = -1
	}
	return nil
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
	js         jetstream.JetStream
}

// Setup creates, or opens and checks, everything a namespace needs: the jobs
// stream, the dead-letter stream and the leases, members, results and state
// buckets. It is idempotent; run it as often as you like. The per-partition
// consumers are made by the partition owner when it takes the lease.
func Setup(ctx context.Context, js jetstream.JetStream, cfg TopologyConfig) (*Topology, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	names := Names{Namespace: cfg.Namespace}
	n, err := ensureJobs(ctx, js, names, &cfg)
	if err != nil {
		return nil, err
	}
	t := &Topology{Names: names, Partitions: n, Config: cfg, js: js}
	t.Jobs, err = js.Stream(ctx, names.Jobs())
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
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
	return t, nil
}

// Open reads an existing namespace for a client: it checks the jobs
// stream's metadata and returns its partition count. A non-zero want that
// differs from the stream's is refused with ErrPartitionMismatch.
func Open(ctx context.Context, js jetstream.JetStream, namespace string, want int) (int, error) {
	cfg := TopologyConfig{Namespace: namespace, Partitions: want}
	if err := cfg.setDefaults(); err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, Names{Namespace: cfg.Namespace}.Jobs())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, ErrNoTopology
	}
	if err != nil {
		return 0, err
	}
	return checkMeta(s.CachedInfo().Config, want)
}

func ensureJobs(ctx context.Context, js jetstream.JetStream, names Names, cfg *TopologyConfig) (int, error) {
	s, err := js.Stream(ctx, names.Jobs())
	if err == nil {
		sc := s.CachedInfo().Config
		n, err := checkMeta(sc, cfg.Partitions)
		if err == nil && !sc.AllowAtomicPublish {
			// Made by an older keylane: allow group commit (see
			// ClientConfig.GroupCommit). A server before 2.12 refuses;
			// clients then fall back to single publishes.
			sc.AllowAtomicPublish = true
			_, _ = js.UpdateStream(ctx, sc)
		}
		return n, err
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, err
	}
	n := cfg.Partitions
	if n == 0 {
		n = 16
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        names.Jobs(),
		Description: "keylane jobs, one subject per partition",
		Subjects:    []string{partition.SubjectWildcard(cfg.Namespace)},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		MaxBytes:    cfg.MaxBytes,
		Discard:     jetstream.DiscardNew,
		// Lets clients group-commit jobs in atomic batches.
		AllowAtomicPublish: true,
		Metadata: map[string]string{
			MetaPartitions: strconv.Itoa(n),
			MetaHash:       partition.HashName,
			MetaVersion:    "1",
		},
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another worker won the race to create it: check what it made.
		return ensureJobs(ctx, js, names, cfg)
	}
	if err != nil {
		return 0, fmt.Errorf("keylane: create jobs stream: %w", err)
	}
	return n, nil
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
		Replicas:      t.Config.Replicas,
	}
}
