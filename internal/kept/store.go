package kept

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is what a Store is built from: one partition tenure's view of
// the results bucket.
type Config struct {
	// NC is the worker's connection: batched look-ups, leader gets,
	// atomic batches. Required.
	NC *nats.Conn
	// JS publishes batch entries. Required.
	JS jetstream.JetStream
	// Results is the results bucket's name: its stream is KV_<Results>,
	// its keys' subjects $KV.<Results>.<key>. Required.
	Results string
	// BatchMin is the fewest outcome puts that go as one atomic batch
	// (WorkerConfig.OutcomeBatch resolved), at least 2; 0 means never.
	// Defaults to 0.
	BatchMin int
	// Memory is the worker's memory of what the server refused, shared by
	// the Stores of its tenures. Defaults to a memory of this Store's own.
	Memory *Memory
	// Log receives the Store's events (the tenure's logger). Defaults to
	// a logger that discards.
	Log *slog.Logger
	// Single says the results stream has one replica (the namespace's
	// Replicas is 1): its one server answers every direct get, so a direct
	// get reads what a leader get would. A batch entry is then read with a
	// direct get (headers, no JSON API request: the claim on receipt of
	// each batch message of Calls is one); on a replicated stream, where a
	// follower behind may answer a direct get, with a leader get. Defaults
	// to false.
	Single bool
}

// Store is one partition tenure's kept outcomes: it looks outcomes up by
// job ID, keeps a group's outcomes (as one atomic batch where it may),
// writes and reads batch entries, and remembers the newest outcome the
// tenure kept (see "The mark" in the package doc). Build it with New when
// the tenure begins; it lives as long as the tenure. Safe for concurrent
// use.
type Store struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	results string
	stream  string // KV_<results>
	prefix  string // $KV.<results>.
	min     int
	single  bool // one replica: a direct get is as good as a leader get
	mem     *Memory
	log     *slog.Logger

	mark atomic.Pointer[mark] // newest outcome kept this tenure

	lookUps rounds[string, map[string]*Outcome] // look-ups shared across the tenure's lanes (shared.go)
	keeps   rounds[Put, error]                  // outcome keeps shared across them (shared.go)
}

// New returns the Store cfg describes.
func New(cfg Config) *Store {
	s := &Store{
		nc: cfg.NC, js: cfg.JS, results: cfg.Results,
		stream: "KV_" + cfg.Results, prefix: "$KV." + cfg.Results + ".",
		min: cfg.BatchMin, single: cfg.Single, mem: cfg.Memory, log: cfg.Log,
	}
	if s.mem == nil {
		s.mem = &Memory{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.lookUps.gathered, s.keeps.gathered = &s.mem.sharedRounds, &s.mem.sharedKeeps
	return s
}

// Subject returns key's subject in the results bucket.
func (s *Store) Subject(key string) string { return s.prefix + key }

// Memory is a worker's memory of how the server takes the batched forms:
// the batched look-up (off for a while after a refusal, probed once) and
// atomic batches of outcomes (their size limit, off for a while after a
// refusal). Its zero value tries both. Safe for concurrent use.
type Memory struct {
	// The batched kept-outcome look-up: off until this time (unix ns)
	// after the server refused it; probed once it worked.
	lookUpOff atomic.Int64
	probed    atomic.Bool

	mu       sync.Mutex
	offUntil time.Time // batches refused: single puts until then
	max      int       // largest batch to send; 0 means batchMax

	batches atomic.Int64 // batches committed

	sharedRounds atomic.Int64 // look-up rounds that gathered while another was in flight
	sharedKeeps  atomic.Int64 // keep rounds that gathered while another was in flight
	refused      atomic.Int64 // batches refused, their outcomes put one by one
}

// Batches returns how many atomic batches of outcomes were committed.
func (m *Memory) Batches() int64 { return m.batches.Load() }

// Refused returns how many atomic batches the server refused (their
// outcomes then went one by one).
func (m *Memory) Refused() int64 { return m.refused.Load() }

// SharedRounds returns how many look-up rounds gathered the IDs of
// groups that asked while another round was in flight (LookUpShared).
func (m *Memory) SharedRounds() int64 { return m.sharedRounds.Load() }

// SharedKeeps returns how many rounds of outcome keeps gathered the puts
// of groups that asked while another was in flight (KeepShared).
func (m *Memory) SharedKeeps() int64 { return m.sharedKeeps.Load() }

// PauseBatches keeps outcomes one by one until until, as after a refusal.
func (m *Memory) PauseBatches(until time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.offUntil = until
}

// LookUpsOff returns until when (unix ns; 0: never turned off) the
// batched look-up is off, and whether a batched look-up went through.
func (m *Memory) LookUpsOff() (until int64, probed bool) {
	return m.lookUpOff.Load(), m.probed.Load()
}

// PauseLookUps turns the batched look-up off until until: outcomes are
// looked up one ID at a time till then.
func (m *Memory) PauseLookUps(until time.Time) { m.lookUpOff.Store(until.UnixNano()) }

// Outcome is a job's outcome as kept by ID: its result, or its error (a
// *core.RemoteError, or an *UnreadableError for an entry that does not
// decode).
type Outcome struct {
	Res []byte
	Err error
}

// mark is the newest outcome this tenure kept: its subject in the results
// bucket and its stream sequence. The previous owners' outcomes were all
// stored before this tenure's first (their leases ended before ours
// began), and this tenure's before it looks anything up again, so a
// replica whose last sequence is at or past seq has every outcome a
// look-up must see.
type mark struct {
	subject string
	seq     uint64
}

// NoteKept records that an outcome was stored under subject at seq.
func (s *Store) NoteKept(subject string, seq uint64) {
	for {
		cur := s.mark.Load()
		if cur != nil && cur.seq >= seq {
			return
		}
		if s.mark.CompareAndSwap(cur, &mark{subject: subject, seq: seq}) {
			return
		}
	}
}

// currentMark returns the tenure's mark; until the tenure kept an
// outcome, the results stream's newest message as its leader says (one
// leader get, until one succeeds): every earlier owner's outcome lies at
// or below it. A stream with no message gives a mark with no subject: any
// complete answer is current. nil means not known (the get failed).
func (s *Store) currentMark(ctx context.Context) *mark {
	if m := s.mark.Load(); m != nil {
		return m
	}
	ctx, cancel := context.WithTimeout(ctx, core.ResultLookupTimeout)
	defer cancel()
	sm, err := LeaderGet(ctx, s.nc, s.stream, s.prefix+">")
	switch {
	case errors.Is(err, ErrNoEntry):
		s.mark.CompareAndSwap(nil, &mark{})
	case err != nil:
		return nil
	default:
		s.NoteKept(sm.Subject, sm.Seq)
	}
	return s.mark.Load()
}
