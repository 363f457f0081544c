package namespace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxStreamShards bounds Config.StreamShards.
const MaxStreamShards = 64

var namespaceRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// Config describes the streams, consumers and buckets of a namespace:
// keylane.TopologyConfig's fields, whose doc says what each means, its
// default and what a mismatch with the namespace as made returns, and
// the worker's MaxDeliver.
type Config struct {
	Namespace       string        // default "keylane"; namespaceRE
	Partitions      int           // N; 0: the stream's, 16 when created
	StreamShards    int           // S; 0: the namespace's, 1 when created; at most N and MaxStreamShards
	Replicas        int           // 0: the jobs stream's, 1 when created
	DuplicateWindow time.Duration // default and least 2 minutes
	LeaseTTL        time.Duration // default 10s
	ResultsTTL      time.Duration // default 1 hour
	MaxBytes        int64         // the jobs stream's bound; default -1, unlimited
	ReplyPrefix     string        // fixed at creation; "": the namespace's, "_INBOX." when created
	MaxKeyBacklog   int64         // fixed at creation; 0: the stream's, none when created
	Delays          bool          // fixed at creation; excludes MaxKeyBacklog and MaxBytes

	// MaxDeliver is the worker's MaxDeliver (0: not a worker's Setup,
	// which neither checks nor fixes it; -1: a worker that follows the
	// namespace's, fixing core.DefaultMaxDeliver if none is).
	MaxDeliver int
}

// SetDefaults fills c's zero fields with their defaults and checks it:
// a bad value is an error, and c is then not to be used.
func (c *Config) SetDefaults() error {
	if c.Namespace == "" {
		c.Namespace = core.DefaultNamespace
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
		c.DuplicateWindow = core.DefaultDuplicateWindow
	}
	if c.DuplicateWindow < core.MinDuplicateWindow {
		return fmt.Errorf("keylane: duplicate window %s is below the %s minimum", c.DuplicateWindow, core.MinDuplicateWindow)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = core.DefaultLeaseTTL
	}
	if c.LeaseTTL < core.MinLeaseTTL {
		return fmt.Errorf("keylane: lease TTL %s is below %s", c.LeaseTTL, core.MinLeaseTTL)
	}
	if c.ResultsTTL == 0 {
		c.ResultsTTL = core.DefaultResultsTTL
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = -1
	}
	if c.MaxKeyBacklog < 0 {
		return fmt.Errorf("keylane: max key backlog must be 0 (no cap, or follow the namespace) or more, got %d", c.MaxKeyBacklog)
	}
	if c.Delays && (c.MaxKeyBacklog > 0 || c.MaxBytes > 0) {
		return fmt.Errorf("keylane: Delays cannot be combined with MaxKeyBacklog or MaxBytes: a due job the jobs stream refused (its key or the stream full) would have nowhere to go")
	}
	if c.ReplyPrefix != "" {
		if err := validReplyPrefix(c.ReplyPrefix, c.Namespace); err != nil {
			return err
		}
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

// Topology is the set of NATS objects of one namespace, opened or created
// by Setup. Setup fills it in; it is read-only after, and safe for
// concurrent reads.
type Topology struct {
	Names      Names
	Partitions int
	Config     Config
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
	Meta Meta
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
// settings, bad config) or a refusal no retry cures (natserr.Permanent:
// replicas above 1 on a server that is not clustered, 10074, and the
// like; returned at once) is made again with backoff until ctx ends; an
// object a concurrent creator made is opened and checked. The
// per-partition consumers are made by the partition owner when it takes
// the lease.
// It says on log (nil: nowhere) why an attempt failed: at WARN for the
// first attempt retried and every tenth, at ERROR for a refusal it gives
// up on.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) (*Topology, error) {
	if err := cfg.SetDefaults(); err != nil {
		return nil, err
	}
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, setupAttemptTimeout)
		t, err := setupOnce(actx, js, cfg)
		cancel()
		if err != nil && permanentSetupError(err) {
			if log != nil {
				log.Error("namespace setup refused; not retrying", "namespace", cfg.Namespace, "err", err)
			}
			return t, err
		}
		if err == nil {
			return t, nil
		}
		if log != nil && ctx.Err() == nil && (attempt == 1 || attempt%10 == 0) {
			log.Warn("namespace setup failed; retrying", "namespace", cfg.Namespace, "attempt", attempt, "err", err)
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

// permanentSetupError reports whether err ends Setup: a mismatch with the
// namespace as made, or a refusal no retry cures. A stream or bucket not
// found is not one: a concurrent creator may be making it.
func permanentSetupError(err error) bool {
	var foreign *foreignStreamError
	return errors.As(err, &foreign) || errors.Is(err, core.ErrPartitionMismatch) || errors.Is(err, core.ErrReplicasMismatch) || errors.Is(err, core.ErrShardsMismatch) ||
		errors.Is(err, lease.ErrBucketMismatch) || errors.Is(err, lease.ErrInvalidConfig) ||
		errors.Is(err, core.ErrKeyBacklogMismatch) || errors.Is(err, core.ErrOldJobsStream) || errors.Is(err, core.ErrDelaysOff) ||
		errors.Is(err, core.ErrReplyPrefixMismatch) || errors.Is(err, core.ErrMaxDeliverMismatch) ||
		natserr.IsPermanent(err) && !errors.Is(err, jetstream.ErrStreamNotFound)
}

func setupOnce(ctx context.Context, js jetstream.JetStream, cfg Config) (*Topology, error) {
	names := Names{Namespace: cfg.Namespace}
	streams, metas, err := ensureShards(ctx, js, names, &cfg)
	if err != nil {
		return nil, err
	}
	meta := JoinMeta(metas)
	t := &Topology{Names: names, Partitions: meta.Partitions, Config: cfg, Meta: meta}
	t.Jobs, t.Streams, t.Shards = streams[0], streams, meta.Shards
	for _, m := range metas {
		t.Epochs = append(t.Epochs, m.Epoch)
	}
	t.Replicas = t.Jobs.CachedInfo().Config.Replicas
	cfg.Replicas = t.Replicas // everything follows the jobs stream
	t.Config.Replicas = t.Replicas
	t.Config.StreamShards = t.Shards
	t.Config.MaxKeyBacklog = meta.MaxKeyBacklog
	t.Config.Delays = meta.Delays
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
	if t.Results, err = EnsureDirectGets(ctx, js, t.Results); err != nil {
		return nil, err
	}
	if err := AllowAtomicPublish(ctx, js, "KV_"+names.Results()); err != nil {
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
		return fmt.Errorf("%w: %s has %d replicas, the namespace %d (configure Replicas %d, or 0 to follow it)", core.ErrReplicasMismatch, name, got, want, got)
	}
	return nil
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

// ConsumerConfig is the durable pull consumer of one partition.
func (t *Topology) ConsumerConfig(p int, ackWait time.Duration, maxAckPending int) jetstream.ConsumerConfig {
	cfg := t.consumerBase(p, ackWait, maxAckPending)
	if t.Meta.Delays {
		// The partition's delayed jobs' submissions too: its owner moves
		// them into the delays stream (see the worker's moveDelayed).
		cfg.FilterSubjects = []string{cfg.FilterSubject, partition.DelayFilter(t.Names.Namespace, p)}
		cfg.FilterSubject = ""
	}
	return cfg
}

func (t *Topology) consumerBase(p int, ackWait time.Duration, maxAckPending int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       t.Names.Consumer(p),
		Description:   "keylane partition " + strconv.Itoa(p),
		FilterSubject: partition.Filter(t.Names.Namespace, p),
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

// EnsureDirectGets lets the results bucket's stream answer direct gets
// (AllowDirect), which the batched look-up needs: buckets created by
// keylane have it (nats.go sets it), one created otherwise is upgraded in
// place and bound again, so its handle's Get uses direct gets too.
func EnsureDirectGets(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) (jetstream.KeyValue, error) {
	name := "KV_" + kv.Bucket()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	sc := s.CachedInfo().Config
	if sc.AllowDirect {
		return kv, nil
	}
	sc.AllowDirect = true
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return nil, fmt.Errorf("keylane: allow direct gets on %s: %w", name, err)
	}
	return js.KeyValue(ctx, kv.Bucket())
}

// AllowAtomicPublish lets the stream (the results bucket's) take atomic
// batches, updating a stream made by an older keylane in place. A server
// that refuses the flag (before 2.12) leaves it off, and workers keep
// outcomes one by one; only a failed request is an error (Setup tries
// again).
func AllowAtomicPublish(ctx context.Context, js jetstream.JetStream, name string) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	sc := s.CachedInfo().Config
	if sc.AllowAtomicPublish {
		return nil
	}
	sc.AllowAtomicPublish = true
	_, err = js.UpdateStream(ctx, sc)
	var apiErr *jetstream.APIError
	if err != nil && !errors.As(err, &apiErr) {
		return fmt.Errorf("keylane: allow atomic batches on %s: %w", name, natserr.Once(err))
	}
	return nil
}
