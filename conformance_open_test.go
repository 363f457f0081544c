package keylane

// Conformance vectors of opening a namespace (streams.json: the jobs
// streams' configs a producer reads and what it accepts or refuses) and of
// delayed jobs (delays.json: a delayed submission as the client builds it,
// the client's run-at rules, the worker's). Made by the real code on a real
// server, like the other vectors (conformance_test.go).

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ---- streams.json

// streamsVector is one namespace's jobs streams as a producer finds them
// (each stream's config, as its stream info returns it: the fields
// keylane reads) and what the Go client's open (NewClient) makes of them.
type streamsVector struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// ClientPartitions is the partition count the client was configured
	// with (ClientConfig.Partitions): 0 follows the namespace.
	ClientPartitions int              `json:"client_partitions"`
	Streams          []map[string]any `json:"streams"`
	Accepted         bool             `json:"accepted"`
	Settings         *streamSettings  `json:"settings,omitempty"`
	// GoError names the sentinel the Go refusal wraps, Error is its text.
	GoError string `json:"go_error"`
	Error   string `json:"error"`
}

// streamSettings is what a producer takes from an accepted namespace.
type streamSettings struct {
	Partitions    int    `json:"partitions"`
	Shards        int    `json:"shards"`
	ReplyPrefix   string `json:"reply_prefix"`
	MaxKeyBacklog int64  `json:"max_key_backlog"`
	Delays        bool   `json:"delays"`
	// JobsStreams is each shard's jobs stream, by shard index: the
	// Nats-Expected-Stream of partition p is JobsStreams[p mod Shards].
	JobsStreams []string `json:"jobs_streams"`
}

// streamConfigFields are the stream config fields a vector lists: those
// keylane reads, and those a stream needs to be created as it is.
var streamConfigFields = []string{"name", "subjects", "retention", "discard", "metadata", "max_msgs_per_subject", "discard_new_per_subject", "allow_rollup_hdrs", "allow_msg_schedules"}

func streamConfigJSON(t *testing.T, sc jetstream.StreamConfig) map[string]any {
	b, err := json.Marshal(sc)
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]any
	if err := json.Unmarshal(b, &all); err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for _, f := range streamConfigFields {
		if v, ok := all[f]; ok {
			out[f] = v
		}
	}
	for _, f := range []string{"max_msgs_per_subject", "discard_new_per_subject", "allow_rollup_hdrs", "allow_msg_schedules"} {
		if _, ok := out[f]; !ok {
			// Absent means the zero value; listed, the vector says so.
			out[f] = map[bool]any{true: 0, false: false}[f == "max_msgs_per_subject"]
		}
	}
	return out
}

// goErrorName names the sentinel err wraps, among those opening a
// namespace returns.
func goErrorName(err error) string {
	for _, s := range []struct {
		name string
		err  error
	}{
		{"ErrNoTopology", ErrNoTopology}, {"ErrPartitionMismatch", ErrPartitionMismatch}, {"ErrOldJobsStream", ErrOldJobsStream},
		{"ErrShardsMismatch", ErrShardsMismatch}, {"ErrMaxDeliverMismatch", ErrMaxDeliverMismatch},
		{"ErrBadDelay", ErrBadDelay}, {"ErrDelaysOff", ErrDelaysOff},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return "?"
}

// openVector creates v's streams on a fresh server, opens the namespace
// with the Go client (NewClient) and fills in what it made of them.
func openVector(t *testing.T, v *streamsVector) {
	t.Helper()
	srv := natstest.Start(t, natstest.WithServerName("streams"))
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range v.Streams {
		b, _ := json.Marshal(s)
		var sc jetstream.StreamConfig
		if err := json.Unmarshal(b, &sc); err != nil {
			t.Fatalf("streams %s: %v", v.Name, err)
		}
		sc.Storage = jetstream.MemoryStorage
		if _, err := js.CreateStream(ctx(t), sc); err != nil {
			t.Fatalf("streams %s: create %s: %v", v.Name, sc.Name, err)
		}
	}
	c, err := NewClient(ctx(t), nc, ClientConfig{Namespace: v.Namespace, Partitions: v.ClientPartitions})
	v.Accepted, v.Settings, v.GoError, v.Error = err == nil, nil, "", ""
	if err != nil {
		v.GoError, v.Error = goErrorName(err), err.Error()
		return
	}
	defer c.Close()
	cc := c.e.Config()
	st := &streamSettings{Partitions: cc.Partitions, Shards: len(cc.Streams), ReplyPrefix: cc.ReplyPrefix, MaxKeyBacklog: cc.MaxKeyBacklog, Delays: cc.Delays}
	st.JobsStreams = append(st.JobsStreams, cc.Streams...)
	v.Settings = st
}

// conformanceEpoch is the keylane.epoch the vectors' streams carry.
const conformanceEpoch = "1f2e3d4c5b6a7988"

func streamsVectors(t *testing.T) []streamsVector {
	// jobsStream is shard i of s of namespace ns with n partitions, as
	// Setup makes it, with md's entries set on its metadata ("" deletes).
	jobsStream := func(ns string, n, s, i int, delays bool, md map[string]string) jetstream.StreamConfig {
		names := Names{Namespace: ns}
		meta := map[string]string{
			MetaPartitions: strconv.Itoa(n), MetaHash: partition.HashName, MetaVersion: namespace.SubjectsVersion,
			MetaReplyPrefix: DefaultReplyPrefix, MetaEpoch: conformanceEpoch,
		}
		if s > 1 {
			meta[MetaShards], meta[MetaShard] = strconv.Itoa(s), strconv.Itoa(i)
		}
		if delays {
			meta[MetaDelays] = namespace.DelaysScheme
		}
		for k, v := range md {
			if v == "" {
				delete(meta, k)
			} else {
				meta[k] = v
			}
		}
		return jetstream.StreamConfig{Name: names.JobsShard(i), Subjects: namespace.ShardSubjects(ns, n, s, i, delays),
			Retention: jetstream.WorkQueuePolicy, Discard: jetstream.DiscardNew, Metadata: meta}
	}
	one := func(md map[string]string) []jetstream.StreamConfig {
		return []jetstream.StreamConfig{jobsStream("store", 4, 1, 0, false, md)}
	}
	with := func(scs []jetstream.StreamConfig, f func(sc *jetstream.StreamConfig)) []jetstream.StreamConfig {
		f(&scs[0])
		return scs
	}
	two := func(md0, md1 map[string]string) []jetstream.StreamConfig {
		return []jetstream.StreamConfig{jobsStream("store", 4, 2, 0, false, md0), jobsStream("store", 4, 2, 1, false, md1)}
	}
	cases := []struct {
		name, ns string
		want     int
		streams  []jetstream.StreamConfig
	}{
		// Accepted.
		{"one-stream", "store", 0, one(nil)},
		{"client-configured-same-partitions", "store", 4, one(nil)},
		{"reply-prefix-absent-means-inbox", "store", 0, one(map[string]string{MetaReplyPrefix: ""})},
		{"reply-prefix-other", "store", 0, one(map[string]string{MetaReplyPrefix: "replies."})},
		{"epoch-absent", "store", 0, one(map[string]string{MetaEpoch: ""})},
		{"key-backlog-cap", "store", 0, with(one(nil), func(sc *jetstream.StreamConfig) { sc.MaxMsgsPerSubject, sc.DiscardNewPerSubject = 100, true })},
		{"per-subject-limit-without-discard-new-is-no-cap", "store", 0, with(one(nil), func(sc *jetstream.StreamConfig) { sc.MaxMsgsPerSubject = 100 })},
		{"delays", "store", 0, []jetstream.StreamConfig{jobsStream("store", 4, 1, 0, true, nil)}},
		{"delays-other-value-is-no-delays", "store", 0, one(map[string]string{MetaDelays: "1"})},
		{"workers-metadata", "store", 0, one(map[string]string{MetaMaxDeliver: "5", MetaAdopted: "a1,B2", "keylane.batches": "on", "x-other": "y"})},
		{"two-shards", "store", 0, two(nil, nil)},
		{"two-shards-prefix-absent-and-inbox-agree", "store", 0, two(map[string]string{MetaReplyPrefix: ""}, nil)},
		{"dashed-namespace", "orders-us", 0, []jetstream.StreamConfig{jobsStream("orders-us", 8, 1, 0, false, nil)}},
		// Refused: the namespace.
		{"no-jobs-stream", "store", 0, nil},
		{"foreign-namespace-stream", "a-b", 0, []jetstream.StreamConfig{jobsStream("a_b", 4, 1, 0, false, nil)}},
		// Refused: partitions and hash.
		{"partitions-absent", "store", 0, one(map[string]string{MetaPartitions: ""})},
		{"partitions-not-a-number", "store", 0, one(map[string]string{MetaPartitions: "four"})},
		{"partitions-zero", "store", 0, one(map[string]string{MetaPartitions: "0"})},
		{"partitions-over-4096", "store", 0, one(map[string]string{MetaPartitions: "4097"})},
		{"client-configured-other-partitions", "store", 8, one(nil)},
		{"hash-other", "store", 0, one(map[string]string{MetaHash: "fnv1a-mod"})},
		{"hash-absent", "store", 0, one(map[string]string{MetaHash: ""})},
		// Refused: an earlier layout.
		{"version-2", "store", 0, one(map[string]string{MetaVersion: "2"})},
		{"version-3-one-job-messages", "store", 0, one(map[string]string{MetaVersion: "3"})},
		{"version-absent", "store", 0, one(map[string]string{MetaVersion: ""})},
		{"allows-message-schedules", "store", 0, with(one(nil), func(sc *jetstream.StreamConfig) {
			sc.AllowMsgSchedules, sc.Retention, sc.Discard = true, jetstream.LimitsPolicy, jetstream.DiscardOld
		})},
		{"allows-rollups", "store", 0, with(one(nil), func(sc *jetstream.StreamConfig) { sc.AllowRollup = true })},
		// Refused: workers' metadata a producer does not use but checks.
		{"max-deliver-zero", "store", 0, one(map[string]string{MetaMaxDeliver: "0"})},
		{"max-deliver-not-a-number", "store", 0, one(map[string]string{MetaMaxDeliver: "five"})},
		{"epoch-zero", "store", 0, one(map[string]string{MetaEpoch: "0"})},
		{"epoch-not-hex", "store", 0, one(map[string]string{MetaEpoch: "xyz"})},
		{"epoch-over-64-bits", "store", 0, one(map[string]string{MetaEpoch: "1" + strings.Repeat("0", 16)})},
		{"adopted-not-hex", "store", 0, one(map[string]string{MetaAdopted: "a1,zz"})},
		// Refused: shards.
		{"shards-not-a-number", "store", 0, one(map[string]string{MetaShards: "two", MetaShard: "0"})},
		{"shards-over-partitions", "store", 0, one(map[string]string{MetaShards: "8", MetaShard: "0"})},
		{"shard-index-absent", "store", 0, one(map[string]string{MetaShards: "2"})},
		{"shard-missing", "store", 0, two(nil, nil)[:1]},
		{"shard-says-another-index", "store", 0, two(nil, map[string]string{MetaShard: "0"})},
		{"shard-0-says-another-index", "store", 0, two(map[string]string{MetaShard: "1"}, nil)},
		{"shards-disagree-on-count", "store", 0, two(nil, map[string]string{MetaShards: "3", MetaShard: "1"})},
		{"shards-disagree-on-partitions", "store", 0, two(nil, map[string]string{MetaPartitions: "6"})},
		{"shards-disagree-on-reply-prefix", "store", 0, two(nil, map[string]string{MetaReplyPrefix: "replies."})},
		{"shard-of-another-layout", "store", 0, two(nil, map[string]string{MetaVersion: "2"})},
		{"shard-allows-rollups", "store", 0, func() []jetstream.StreamConfig {
			scs := two(nil, nil)
			scs[1].AllowRollup = true
			return scs
		}()},
	}
	var out []streamsVector
	for _, c := range cases {
		v := streamsVector{Name: c.name, Namespace: c.ns, ClientPartitions: c.want, Streams: []map[string]any{}}
		for _, sc := range c.streams {
			v.Streams = append(v.Streams, streamConfigJSON(t, sc))
		}
		out = append(out, v)
	}
	return out
}

func (g *conformanceGen) streams() any {
	vs := streamsVectors(g.t)
	for i := range vs {
		g.t.Run("streams/"+vs[i].Name, func(t *testing.T) { openVector(t, &vs[i]) })
	}
	return map[string]any{"protocol": protocolVersion, "vectors": vs}
}

// ---- delays.json

type delayedInput struct {
	Key         string `json:"key"`
	ID          string `json:"id"`
	IDGenerated bool   `json:"id_generated"`
	Type        string `json:"type"`
	Headers     hdrs   `json:"headers"`
	PayloadHex  string `json:"payload_hex"`
	// RunAt is the time the caller asked for (RFC 3339, any offset).
	RunAt string `json:"run_at"`
}

type parsedDelayed struct {
	ID         string `json:"id"`
	Key        string `json:"key"`
	Type       string `json:"type"`
	Idempotent bool   `json:"idempotent"`
	RunAt      string `json:"run_at"`
	Partition  int    `json:"partition"`
}

// delayedVector is a delayed job's submission as the Go client publishes
// it, a batch of one on its delay subject with the run-at on the message
// (its payload the batch body), and as the worker of its partition reads
// it (wire.Rules.ParseDelayedBatch) when the stream stored it at StoredAt.
type delayedVector struct {
	Name        string        `json:"name"`
	Namespace   string        `json:"namespace"`
	Partitions  int           `json:"partitions"`
	Shards      int           `json:"shards"`
	ReplyPrefix string        `json:"reply_prefix"`
	Input       delayedInput  `json:"input"`
	Message     jobMessage    `json:"message"`
	StoredAt    string        `json:"stored_at"`
	Parsed      parsedDelayed `json:"parsed"`
}

// runAtVector is the Go client's decision on a run-at time OffsetMs from
// now: "delayed" (a delayed submission), "now" (an ordinary job: due) or
// "refused" (nothing sent; GoError and Error say why).
type runAtVector struct {
	Name     string `json:"name"`
	Delays   bool   `json:"delays"`
	OffsetMs int64  `json:"offset_ms"`
	Result   string `json:"result"`
	GoError  string `json:"go_error"`
	Error    string `json:"error"`
}

// workerRunAtVector is the worker's reading of a submission's
// Keylane-Run-At values (everything else valid), stored at StoredAt.
type workerRunAtVector struct {
	Name     string   `json:"name"`
	StoredAt string   `json:"stored_at"`
	RunAt    []string `json:"run_at"`
	Accepted bool     `json:"accepted"`
	Due      string   `json:"due"`
	Error    string   `json:"error"`
}

// The run-at time of the delayed submissions' vectors, and when the
// stream stored them.
var (
	conformanceRunAt    = time.Date(2026, 11, 27, 13, 0, 0, 250_000_000, time.FixedZone("", 3600))
	conformanceStoredAt = time.Date(2026, 11, 27, 11, 0, 0, 0, time.UTC)
)

func (g *conformanceGen) delayed() []delayedVector {
	const ns = "timers"
	in := []struct {
		name, key string
		in        delayedInput
	}{
		{"delayed-with-id", "customer:42", delayedInput{ID: "order.17", Type: "reserve", Headers: hdrs{"X-Tenant": {"acme"}}, PayloadHex: hx([]byte(`{"sku":"A1"}`))}},
		{"delayed-generated-id", "order-1", delayedInput{ID: conformanceNUID1, IDGenerated: true, PayloadHex: hx([]byte("hello"))}},
		{"delayed-on-shard-1", keyIn(1, 4, "seat:"), delayedInput{ID: "release-7", PayloadHex: ""}},
	}
	var out []delayedVector
	for _, v := range in {
		c, topo := g.clients[ns], g.topos[ns]
		v.in.Key = v.key
		v.in.RunAt = conformanceRunAt.Format(time.RFC3339Nano)
		payload, _ := hex.DecodeString(v.in.PayloadHex)
		// The client checks the run-at time against its clock: it is given
		// one an hour from now, with the vector's offset and fraction, and
		// the vector's time is put in its place in what it built.
		real := time.Now().Add(time.Hour).Truncate(time.Second).Add(250 * time.Millisecond).In(conformanceRunAt.Location())
		r := Request{Key: v.in.Key, Type: v.in.Type, Payload: payload, RunAt: real}
		if !v.in.IDGenerated {
			r.ID = v.in.ID
		}
		if len(v.in.Headers) > 0 {
			r.Headers = nats.Header{}
			for k, vs := range v.in.Headers {
				r.Headers[k] = slices.Clone(vs)
			}
		}
		m, err := c.e.Message(&r, "")
		if err != nil {
			g.t.Fatalf("delayed %s: %v", v.name, err)
		}
		p := partition.Of(v.in.Key, topo.Partitions)
		if got, want := m.Header[HeaderRunAt], []string{real.UTC().Format(time.RFC3339Nano)}; !slices.Equal(got, want) {
			g.t.Fatalf("delayed %s: the client writes run-at %q for %s, the vector's substitution expects %q", v.name, got, real, want)
		}
		m.Header[HeaderRunAt] = []string{conformanceRunAt.UTC().Format(time.RFC3339Nano)}
		// It goes as a batch of one (Client.alone), under a batch ID of
		// its own: the vector's fixed one, sealed here as sealBatch would.
		m.Header[headerSealedBatch] = []string{conformanceNUID1}
		if v.in.IDGenerated {
			v.in.ID = wire.BatchedJobID(conformanceNUID1, 0)
			m.Header[HeaderJobID] = []string{v.in.ID}
		}
		bm, err := c.e.BatchMessage(p, []*nats.Msg{m})
		if err != nil {
			g.t.Fatalf("delayed %s: %v", v.name, err)
		}
		if bm.Subject != partition.DelaySubject(ns, p, v.in.ID) {
			g.t.Fatalf("delayed %s: subject %s is not %s", v.name, bm.Subject, partition.DelaySubject(ns, p, v.in.ID))
		}
		m = bm
		d, _, _, err := g.rules(ns, p).ParseDelayedBatch(m.Subject, m.Header, m.Data, conformanceStoredAt)
		if err != nil {
			g.t.Fatalf("delayed %s refused by the worker's rules: %v", v.name, err)
		}
		if v.in.Headers == nil {
			v.in.Headers = hdrs{}
		}
		out = append(out, delayedVector{
			Name: v.name, Namespace: ns, Partitions: topo.Partitions, Shards: topo.Shards, ReplyPrefix: topo.Meta.ReplyPrefix,
			Input: v.in, Message: jobMessage{Subject: m.Subject, Headers: hdrs(m.Header), PayloadHex: hx(m.Data)},
			StoredAt: conformanceStoredAt.Format(time.RFC3339Nano),
			Parsed:   parsedDelayed{ID: d.ID, Key: d.Key, Type: d.Type, Idempotent: d.Idempotent, RunAt: d.RunAt.UTC().Format(time.RFC3339Nano), Partition: p},
		})
	}
	return out
}

// runAtRules are the Go client's decisions on run-at times, at offsets
// from now far enough from each bound that the clock moving while the
// test runs cannot change them.
func (g *conformanceGen) runAtRules() []runAtVector {
	var out []runAtVector
	for _, c := range []struct {
		name   string
		delays bool
		off    time.Duration
	}{
		{"an-hour-ago", true, -time.Hour},
		{"past-the-tolerance", true, -2 * RunAtTolerance},
		{"within-the-tolerance-runs-now", true, -RunAtTolerance / 2},
		{"in-an-hour", true, time.Hour},
		{"just-under-max-delay", true, MaxDelay - time.Minute},
		{"beyond-max-delay", true, MaxDelay + time.Minute},
		{"no-delays-in-an-hour", false, time.Hour},
		{"no-delays-within-the-tolerance-runs-now", false, -RunAtTolerance / 2},
		{"no-delays-beyond-max-delay", false, MaxDelay + time.Minute},
	} {
		cl := g.clients["keylane"]
		if c.delays {
			cl = g.clients["timers"]
		}
		r := Request{Key: "seat:A7", ID: "hold-1", RunAt: time.Now().Add(c.off)}
		m, err := cl.e.Message(&r, "")
		v := runAtVector{Name: c.name, Delays: c.delays, OffsetMs: c.off.Milliseconds()}
		switch {
		case err != nil:
			// The text up to the time it names (which moves with the clock).
			text, _, _ := strings.Cut(err.Error(), ": run-at ")
			v.Result, v.GoError, v.Error = "refused", goErrorName(err), text
		case m.Header[HeaderRunAt] != nil:
			v.Result = "delayed"
		default:
			v.Result = "now"
		}
		out = append(out, v)
	}
	return out
}

func (g *conformanceGen) workerRunAt() []workerRunAtVector {
	const ns, n, p = "keylane", 4, 1
	rules := wire.Rules{Namespace: ns, Partition: p, Partitions: n, ReplyPrefix: DefaultReplyPrefix, DelaysStream: Names{Namespace: ns}.Delays(), Delays: true}
	stored := conformanceStoredAt
	limit := stored.Add(wire.MaxDelay + wire.RunAtSlack)
	var out []workerRunAtVector
	for _, c := range []struct {
		name  string
		runAt []string
	}{
		{"in-an-hour", []string{"2026-11-27T12:00:00Z"}},
		{"offset-and-nanoseconds", []string{"2026-11-27T13:00:00.123456789+01:00"}},
		{"in-the-past-is-due-at-once", []string{"2020-01-01T00:00:00Z"}},
		{"at-max-delay-and-slack", []string{limit.Format(time.RFC3339)}},
		{"past-max-delay-and-slack", []string{limit.Add(time.Second).Format(time.RFC3339)}},
		{"date-only", []string{"2026-11-27"}},
		{"no-offset", []string{"2026-11-27T12:00:00"}},
		{"unix-seconds", []string{"1795780800"}},
		{"empty", []string{""}},
		{"given-twice", []string{"2026-11-27T12:00:00Z", "2026-11-27T12:00:00Z"}},
	} {
		h := hdrs{HeaderJobID: {"hold-1"}, HeaderKey: {keyIn(p, n, "seat:")}, HeaderPartitions: {"4"}, HeaderRunAt: c.runAt}
		d, err := rules.ParseDelayed(partition.DelaySubject(ns, p, "hold-1"), h, stored)
		v := workerRunAtVector{Name: c.name, StoredAt: stored.Format(time.RFC3339Nano), RunAt: c.runAt, Accepted: err == nil}
		if err != nil {
			v.Error = "malformed: " + err.Error()
		} else {
			v.Due = d.RunAt.UTC().Format(time.RFC3339Nano)
		}
		out = append(out, v)
	}
	return out
}

func (g *conformanceGen) delays() any {
	return map[string]any{"protocol": protocolVersion, "max_delay_ms": MaxDelay.Milliseconds(), "run_at_tolerance_ms": RunAtTolerance.Milliseconds(),
		"run_at_slack_ms": wire.RunAtSlack.Milliseconds(),
		"submissions":     g.delayed(), "run_at_rules": g.runAtRules(), "worker_run_at": g.workerRunAt()}
}

// checkDelaysRead checks delays.json in the reading direction: the
// worker's reading of each submission and each run-at value.
func checkDelaysRead(t *testing.T, raw []byte) {
	var f struct {
		Submissions  []delayedVector
		WorkerRunAt  []workerRunAtVector `json:"worker_run_at"`
		MaxDelayMs   int64               `json:"max_delay_ms"`
		ToleranceMs  int64               `json:"run_at_tolerance_ms"`
		RunAtSlackMs int64               `json:"run_at_slack_ms"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if f.MaxDelayMs != MaxDelay.Milliseconds() || f.ToleranceMs != RunAtTolerance.Milliseconds() || f.RunAtSlackMs != wire.RunAtSlack.Milliseconds() {
		t.Errorf("delays.json: bounds %d/%d/%d ms, the code's %d/%d/%d", f.MaxDelayMs, f.ToleranceMs, f.RunAtSlackMs, MaxDelay.Milliseconds(), RunAtTolerance.Milliseconds(), wire.RunAtSlack.Milliseconds())
	}
	for _, v := range f.Submissions {
		stored, err := time.Parse(time.RFC3339Nano, v.StoredAt)
		if err != nil {
			t.Fatal(err)
		}
		p := partition.Of(v.Input.Key, v.Partitions)
		r := wire.Rules{Namespace: v.Namespace, Partition: p, Partitions: v.Partitions, ReplyPrefix: v.ReplyPrefix, Delays: true, DelaysStream: Names{Namespace: v.Namespace}.Delays()}
		body, herr := hex.DecodeString(v.Message.PayloadHex)
		if herr != nil {
			t.Fatal(herr)
		}
		d, _, _, err := r.ParseDelayedBatch(v.Message.Subject, v.Message.Headers, body, stored)
		got := parsedDelayed{ID: d.ID, Key: d.Key, Type: d.Type, Idempotent: d.Idempotent, RunAt: d.RunAt.UTC().Format(time.RFC3339Nano), Partition: p}
		if err != nil || got != v.Parsed || v.Message.Subject != partition.DelaySubject(v.Namespace, p, v.Parsed.ID) {
			t.Errorf("delays.json %s: the worker reads %+v (%v), the file says %+v", v.Name, got, err, v.Parsed)
		}
		want := []string{Names{Namespace: v.Namespace}.JobsShard(ShardOf(p, v.Shards))}
		if !slices.Equal(v.Message.Headers[expectStreamHeader], want) {
			t.Errorf("delays.json %s: expected stream %v, the shard's is %v", v.Name, v.Message.Headers[expectStreamHeader], want)
		}
	}
	const ns, n, p = "keylane", 4, 1
	rules := wire.Rules{Namespace: ns, Partition: p, Partitions: n, ReplyPrefix: DefaultReplyPrefix, DelaysStream: Names{Namespace: ns}.Delays(), Delays: true}
	for _, v := range f.WorkerRunAt {
		stored, err := time.Parse(time.RFC3339Nano, v.StoredAt)
		if err != nil {
			t.Fatal(err)
		}
		h := hdrs{HeaderJobID: {"hold-1"}, HeaderKey: {keyIn(p, n, "seat:")}, HeaderPartitions: {"4"}, HeaderRunAt: v.RunAt}
		d, err := rules.ParseDelayed(partition.DelaySubject(ns, p, "hold-1"), h, stored)
		if (err == nil) != v.Accepted || err == nil && d.RunAt.UTC().Format(time.RFC3339Nano) != v.Due || err != nil && "malformed: "+err.Error() != v.Error {
			t.Errorf("delays.json worker_run_at %s: the worker reads %v (%v), the file says %+v", v.Name, d.RunAt, err, v)
		}
	}
}

// checkStreamsRead checks streams.json in the reading direction: each
// vector's streams, created from the file's configs on a real server,
// are opened by the Go client as the file says.
func checkStreamsRead(t *testing.T, raw []byte) {
	var f struct{ Vectors []streamsVector }
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) == 0 {
		t.Fatal("streams.json: no vectors")
	}
	for _, want := range f.Vectors {
		t.Run("streams/"+want.Name, func(t *testing.T) {
			got := want
			got.Streams = slices.Clone(want.Streams)
			openVector(t, &got)
			if got.Accepted != want.Accepted || got.GoError != want.GoError || got.Error != want.Error ||
				(got.Settings == nil) != (want.Settings == nil) || got.Settings != nil && !settingsEqual(*got.Settings, *want.Settings) {
				t.Errorf("streams.json %s: the client opens it as %+v %v %q, the file says %+v %v %q", want.Name, got.Settings, got.Accepted, got.Error, want.Settings, want.Accepted, want.Error)
			}
		})
	}
}

func settingsEqual(a, b streamSettings) bool {
	return a.Partitions == b.Partitions && a.Shards == b.Shards && a.ReplyPrefix == b.ReplyPrefix &&
		a.MaxKeyBacklog == b.MaxKeyBacklog && a.Delays == b.Delays && slices.Equal(a.JobsStreams, b.JobsStreams)
}
