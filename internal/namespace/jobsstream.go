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
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// ShardSubjects lists the subjects of jobs stream shard i of s: those of
// its partitions only, so the subject decides the shard; with delays, each
// partition's delayed jobs' subjects too (ns.delay.<p>.*).
func ShardSubjects(ns string, n, s, i int, delays bool) []string {
	subjects := make([]string, 0, (n+s-1)/s)
	for p := i; p < n; p += s {
		subjects = append(subjects, partition.Filter(ns, p))
	}
	if delays {
		for p := i; p < n; p += s {
			subjects = append(subjects, partition.DelayFilter(ns, p))
		}
	}
	return subjects
}

// ensureShards creates, or opens and checks, every jobs stream shard:
// shard 0 first (it fixes N, S, the replicas and the reply prefix), then
// the others after its example. A missing shard is created with an epoch
// of its own, so a shard deleted and created again is told apart from
// the one it replaced, exactly as a lone jobs stream is.
func ensureShards(ctx context.Context, js jetstream.JetStream, names Names, cfg *Config) ([]jetstream.Stream, []ShardMeta, error) {
	m0, err := ensureJobs(ctx, js, names, cfg)
	if err != nil {
		return nil, nil, err
	}
	s0, err := js.Stream(ctx, names.Jobs())
	if err != nil {
		return nil, nil, err
	}
	streams := []jetstream.Stream{s0}
	metas := []ShardMeta{{m0, s0.CachedInfo()}}
	for i := 1; i < m0.Shards; i++ {
		s, m, err := ensureShard(ctx, js, names, s0.CachedInfo(), m0, i)
		if err != nil {
			return nil, nil, err
		}
		streams = append(streams, s)
		metas = append(metas, ShardMeta{m, s.CachedInfo()})
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
			if err := foreignJobsStream(info.Config, names.Namespace); err != nil {
				return nil, Meta{}, err
			}
			m, err := ReadMeta(info, m0.Partitions)
			if err == nil {
				err = sameShards(m0, m, i, name)
			}
			if err != nil {
				return nil, Meta{}, err
			}
			if info.Config.Replicas != info0.Config.Replicas {
				return nil, Meta{}, fmt.Errorf("%w: jobs stream %s has %d replicas, shard 0 %d", core.ErrReplicasMismatch, name, info.Config.Replicas, info0.Config.Replicas)
			}
			if m.MaxKeyBacklog != m0.MaxKeyBacklog {
				return nil, Meta{}, fmt.Errorf("%w: jobs stream %s caps a key's backlog at %d, shard 0 at %d", core.ErrKeyBacklogMismatch, name, m.MaxKeyBacklog, m0.MaxKeyBacklog)
			}
			cfg := Config{Namespace: names.Namespace}
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
		sc.Subjects = ShardSubjects(names.Namespace, m0.Partitions, m0.Shards, i, m0.Delays)
		sc.Metadata = maps.Clone(sc.Metadata)
		sc.Metadata[MetaShard] = strconv.Itoa(i)
		sc.Metadata[MetaEpoch] = FormatEpoch(epoch)
		sc.FirstSeq = 0
		sc.Sources, sc.Mirror, sc.Placement = nil, nil, nil
		if m0.Delays {
			sc.Sources = dueSources(names, m0.Partitions, m0.Shards, i)
		}
		_, err = js.CreateStream(ctx, sc)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, Meta{}, fmt.Errorf("keylane: create jobs stream %s: %w", name, err)
		}
		// Created, or another worker won the race: open and check it.
	}
}

func ensureJobs(ctx context.Context, js jetstream.JetStream, names Names, cfg *Config) (Meta, error) {
	s, err := js.Stream(ctx, names.Jobs())
	if err == nil {
		info := s.CachedInfo()
		if err := foreignJobsStream(info.Config, names.Namespace); err != nil {
			return Meta{}, err
		}
		meta, err := ReadMeta(info, cfg.Partitions)
		if err != nil {
			return Meta{}, err
		}
		if meta.Shard != 0 {
			return Meta{}, fmt.Errorf("%w: stream %s says it is shard %d", core.ErrShardsMismatch, info.Config.Name, meta.Shard)
		}
		if cfg.StreamShards != 0 && meta.Shards != cfg.StreamShards {
			return Meta{}, fmt.Errorf("%w: namespace %s has %d jobs stream shards, configured %d (configure %d, or 0 to follow it)", core.ErrShardsMismatch, cfg.Namespace, meta.Shards, cfg.StreamShards, meta.Shards)
		}
		if cfg.Delays && !meta.Delays {
			return Meta{}, fmt.Errorf("%w: jobs stream %s was made without Delays (configure false to follow it; keylane does not turn them on later)", core.ErrDelaysOff, info.Config.Name)
		}
		if cfg.MaxKeyBacklog != 0 && meta.MaxKeyBacklog != cfg.MaxKeyBacklog {
			return Meta{}, fmt.Errorf("%w: jobs stream %s caps a key's backlog at %d (0: none), configured %d (configure %d, or 0 to follow it; keylane never changes it: the server would delete stored jobs over a new cap)", core.ErrKeyBacklogMismatch, info.Config.Name, meta.MaxKeyBacklog, cfg.MaxKeyBacklog, meta.MaxKeyBacklog)
		}
		if cfg.Replicas != 0 && info.Config.Replicas != cfg.Replicas {
			return Meta{}, fmt.Errorf("%w: jobs stream %s has %d replicas, configured %d (configure %d, or 0 to follow it)", core.ErrReplicasMismatch, info.Config.Name, info.Config.Replicas, cfg.Replicas, info.Config.Replicas)
		}
		if cfg.ReplyPrefix != "" && meta.ReplyPrefix != cfg.ReplyPrefix {
			return Meta{}, fmt.Errorf("%w: namespace %s replies under %q, configured %q (configure %q, or leave it empty to follow it; it is fixed when the namespace is created)", core.ErrReplyPrefixMismatch, cfg.Namespace, meta.ReplyPrefix, cfg.ReplyPrefix, meta.ReplyPrefix)
		}
		if cfg.MaxDeliver > 0 && meta.MaxDeliver != 0 && meta.MaxDeliver != cfg.MaxDeliver {
			return Meta{}, fmt.Errorf("%w: namespace %s dead-letters a job after %d attempts, configured %d (configure %d, or 0 to follow it; the first worker fixes it)", core.ErrMaxDeliverMismatch, cfg.Namespace, meta.MaxDeliver, cfg.MaxDeliver, meta.MaxDeliver)
		}
		if meta.Delays {
			// Gone (deleted by hand), the delays stream is made again:
			// the jobs stream's source resumes when it is back.
			if err := ensureDelays(ctx, js, names, info.Config.Replicas); err != nil {
				return Meta{}, err
			}
		}
		if meta.MaxDeliver == 0 && cfg.MaxDeliver != 0 {
			meta.MaxDeliver = resolvedMaxDeliver(cfg.MaxDeliver) // upgradeJobs writes it down
		}
		return meta, upgradeJobs(ctx, js, info, meta, cfg)
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return Meta{}, err
	}
	n := cfg.Partitions
	if n == 0 {
		n = core.DefaultPartitions
	}
	replicas := cfg.Replicas
	if replicas == 0 {
		replicas = 1
	}
	shards := max(cfg.StreamShards, 1)
	if shards > n {
		return Meta{}, fmt.Errorf("%w: %d stream shards for %d partitions: every shard needs a partition", core.ErrShardsMismatch, shards, n)
	}
	replyPrefix := cfg.ReplyPrefix
	if replyPrefix == "" {
		replyPrefix = core.DefaultReplyPrefix
	}
	md := map[string]string{
		MetaPartitions:  strconv.Itoa(n),
		MetaHash:        partition.HashName,
		MetaVersion:     SubjectsVersion,
		MetaReplyPrefix: replyPrefix,
	}
	MaxDeliver := 0
	if cfg.MaxDeliver != 0 {
		MaxDeliver = resolvedMaxDeliver(cfg.MaxDeliver)
		md[MetaMaxDeliver] = strconv.Itoa(MaxDeliver)
	}
	if shards > 1 {
		// One shard keeps today's metadata, which older clients read.
		md[MetaShards], md[MetaShard] = strconv.Itoa(shards), "0"
	}
	epoch, err := newEpoch()
	if err != nil {
		return Meta{}, err
	}
	md[MetaEpoch] = FormatEpoch(epoch)
	sc := jetstream.StreamConfig{
		Name:        names.Jobs(),
		Description: "keylane jobs: ns.jobs.<partition>.<key token>",
		Subjects:    ShardSubjects(cfg.Namespace, n, shards, 0, cfg.Delays),
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		Duplicates:  cfg.DuplicateWindow,
		MaxBytes:    cfg.MaxBytes,
		Discard:     jetstream.DiscardNew,
		// Lets clients group-commit jobs in atomic batches.
		AllowAtomicPublish: true,
		Metadata:           md,
	}
	if cfg.Delays {
		// The schedules live in a stream of their own, which only workers
		// publish to; the jobs stream takes submissions on its delay
		// subjects and sources the due copies (see "Delayed jobs").
		if err := ensureDelays(ctx, js, names, replicas); err != nil {
			return Meta{}, err
		}
		md[MetaDelays] = DelaysScheme
		sc.Sources = dueSources(names, n, shards, 0)
	}
	if cfg.MaxKeyBacklog > 0 {
		// A key's jobs are one subject; on a WorkQueue stream an acked
		// job is removed, so the subject's count is the key's backlog, and
		// the server refuses the next one atomically, storing nothing.
		sc.MaxMsgsPerSubject = cfg.MaxKeyBacklog
		sc.DiscardNewPerSubject = true
	}
	_, err = js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another worker won the race to create it: check what it made.
		return ensureJobs(ctx, js, names, cfg)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("keylane: create jobs stream: %w", err)
	}
	return Meta{Partitions: n, Shards: shards, Epoch: epoch, ReplyPrefix: replyPrefix, MaxKeyBacklog: cfg.MaxKeyBacklog, Delays: cfg.Delays, MaxDeliver: MaxDeliver}, nil
}

// resolvedMaxDeliver is Config.MaxDeliver as the namespace keeps
// it: a worker that follows (-1) fixes the default.
func resolvedMaxDeliver(v int) int {
	if v < 0 {
		return core.DefaultMaxDeliver
	}
	return v
}

// upgradeJobs brings a jobs stream made by an older keylane of the same
// subject scheme (ReadMeta refuses older ones) up to date: exactly its
// partitions' subjects, group commit allowed, and
// its epoch written down. Every worker computes the same epoch for an old
// stream (its creation time), so concurrent upgrades agree.
func upgradeJobs(ctx context.Context, js jetstream.JetStream, info *jetstream.StreamInfo, meta Meta, cfg *Config) error {
	sc := info.Config
	if len(sc.Subjects) == 1 && strings.HasPrefix(sc.Subjects[0], cfg.Namespace+".frozen.") {
		// A repartition froze it to drain it: giving it its subjects back
		// would let jobs in that the repartition then deletes with it.
		return fmt.Errorf("keylane: jobs stream %s is frozen by a repartition in progress (subjects %v); waiting until it is replaced", sc.Name, sc.Subjects)
	}
	want := ShardSubjects(cfg.Namespace, meta.Partitions, meta.Shards, meta.Shard, meta.Delays)
	_, hasEpoch := sc.Metadata[MetaEpoch]
	_, hasMaxDeliver := sc.Metadata[MetaMaxDeliver]
	fixMaxDeliver := !hasMaxDeliver && cfg.MaxDeliver != 0 && meta.MaxDeliver > 0 // the first worker's
	if slices.Equal(sc.Subjects, want) && sc.AllowAtomicPublish && hasEpoch && !fixMaxDeliver {
		return nil
	}
	sc.Subjects = want
	// A server before 2.12 refuses atomic publish; clients then fall back
	// to single publishes.
	sc.AllowAtomicPublish = true
	sc.Metadata = maps.Clone(sc.Metadata)
	if !hasEpoch {
		sc.Metadata[MetaEpoch] = FormatEpoch(meta.Epoch)
	}
	if _, ok := sc.Metadata[MetaReplyPrefix]; !ok {
		sc.Metadata[MetaReplyPrefix] = meta.ReplyPrefix
	}
	if fixMaxDeliver {
		sc.Metadata[MetaMaxDeliver] = strconv.Itoa(meta.MaxDeliver)
	}
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		sc.AllowAtomicPublish = false
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("keylane: upgrade jobs stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// dueSources is the source through which jobs stream shard i of s
// takes its partitions' delayed jobs when due: from the delays stream's
// ns.due.<p>.<key token> onto the key's subject ns.jobs.<p>.<key token>.
// A sourced message carries Nats-Stream-Source, which the server refuses
// from any publisher: the mark a due copy is known by.
func dueSources(names Names, n, s, i int) []*jetstream.StreamSource {
	src := &jetstream.StreamSource{Name: names.Delays()}
	for p := i; p < n; p += s {
		src.SubjectTransforms = append(src.SubjectTransforms, jetstream.SubjectTransformConfig{
			Source:      partition.DueFilter(names.Namespace, p),
			Destination: strings.TrimSuffix(partition.Filter(names.Namespace, p), "*") + "{{wildcard(1)}}",
		})
	}
	return []*jetstream.StreamSource{src}
}

// delaysMaxAge bounds how long the delays stream keeps a message: a
// schedule is due at most wire.MaxDelay after its job was stored, and a due
// copy, sourced at once, is deleted by the worker that receives it; one
// left behind (that worker died first) goes after this.
const delaysMaxAge = 2 * wire.MaxDelay

// ensureDelays creates, or opens and checks, the namespace's delays
// stream: the schedules workers store for delayed jobs (ns.sched.<p>.<ID
// token>) and the due copies the server stores when one fires
// (ns.due.<p>.<key token>). Only workers publish to it; it allows message
// schedules, and so roll-ups, which is why it is not the jobs stream.
func ensureDelays(ctx context.Context, js jetstream.JetStream, names Names, replicas int) error {
	if err := schedulesSupported(js); err != nil {
		return err
	}
	s, err := js.Stream(ctx, names.Delays())
	if err == nil {
		if r := s.CachedInfo().Config.Replicas; r != replicas {
			return fmt.Errorf("%w: delays stream %s has %d replicas, the jobs stream %d", core.ErrReplicasMismatch, names.Delays(), r, replicas)
		}
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	ns := names.Namespace
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        names.Delays(),
		Description: "keylane delayed jobs: schedules ns.sched.<partition>.<ID token>, due copies ns.due.<partition>.<key token>",
		Subjects:    []string{ns + ".sched.*.*", ns + ".due.*.*"},
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxAge:      delaysMaxAge,
		// Message schedules need a stream that discards old messages
		// (with no limits set it never does).
		Discard:           jetstream.DiscardOld,
		AllowMsgSchedules: true,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("keylane: create delays stream %s: %w", names.Delays(), err)
	}
	return nil
}

// schedulesSupported refuses a server older than 2.12, which has no
// message schedules for the delays stream.
func schedulesSupported(js jetstream.JetStream) error {
	if v := js.Conn().ConnectedServerVersion(); !serverAtLeast(v, 2, 12) {
		return fmt.Errorf("%w: nats-server %q has no message schedules (2.12 or later)", core.ErrDelaysOff, v)
	}
	return nil
}

// serverAtLeast reports whether a nats-server version string ("2.12.1",
// "2.15.0-beta.2") is major.minor or later; an unreadable one is not.
func serverAtLeast(v string, major, minor int) bool {
	maj, rest, _ := strings.Cut(v, ".")
	mnr, _, _ := strings.Cut(rest, ".")
	ma, err1 := strconv.Atoi(maj)
	mi, err2 := strconv.Atoi(mnr)
	return err1 == nil && err2 == nil && (ma > major || ma == major && mi >= minor)
}
