package kept

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A batch ID's entry (wire.BatchOutcomesKey: the outcomes of a batch
// message's Calls, kept in one results entry) is bound to the message
// that earned it. The server de-duplicates a batch ID per jobs stream and
// within its duplicate window only: a batch under an ID already used (on
// another shard's stream, or on the same one after the window) is stored,
// and its jobs carry the same job IDs (wire.BatchedJobID). Written over
// the first batch's entry, its outcomes answered a retry by ID of the
// first batch's jobs (TestForgedBatchIDNeverOverwritesItsEntry). So the
// entry carries, in a header (HeaderBatchOrigin), the stream, epoch and
// sequence of the message whose outcomes it keeps; it is written only
// over the revision read on receipt (Nats-Expected-Last-Subject-Sequence,
// 0: create only); and a batch whose ID's entry is another message's is
// refused whole once read on receipt (EntryRev; the tenure sends the read
// on receipt and holds the batch's jobs until it answered), before any
// job of it runs. A
// redelivery of the same message finds its own entry and rewrites it.

// HeaderBatchOrigin, on a batch entry, names the batch message whose
// outcomes it keeps (BatchOrigin).
const HeaderBatchOrigin = "Keylane-Batch-Origin"

// ErrBatchIDTaken says a batch ID's entry is another message's.
var ErrBatchIDTaken = errors.New("keylane: batch ID already used by another message")

// BatchOrigin names a batch message: its stream, that stream's epoch
// (hex) and its sequence.
func BatchOrigin(stream string, epoch, seq uint64) string {
	return stream + " " + strconv.FormatUint(epoch, 16) + " " + strconv.FormatUint(seq, 10)
}

// EntrySubject returns the subject of batch batchID's entry.
func (s *Store) EntrySubject(batchID string) string {
	return s.prefix + wire.BatchOutcomesKey(batchID)
}

// EntryRev reads, from the results stream's leader, batch batchID's entry
// as a message named origin may write it: rev is the revision to write
// over (0 when there is none; the entry's own when it is removed or
// origin's), takenBy the origin of another message whose entry it is
// (then rev is 0). An error means the read failed.
func (s *Store) EntryRev(ctx context.Context, batchID, origin string) (rev uint64, takenBy string, err error) {
	return s.entryRev(ctx, s.EntrySubject(batchID), origin)
}

func (s *Store) entryRev(ctx context.Context, subject, origin string) (rev uint64, takenBy string, err error) {
	sm, err := s.entryGet(ctx, subject)
	switch {
	case errors.Is(err, ErrNoEntry):
		return 0, "", nil
	case err != nil:
		return 0, "", err
	case Removed(sm.Header), sm.Header.Get(HeaderBatchOrigin) == origin:
		return sm.Seq, "", nil
	}
	return 0, sm.Header.Get(HeaderBatchOrigin), nil
}

// PutEntry writes v, batch batchID's entry, bound to message origin, over
// revision rev (the one read on receipt) only. An entry found there
// instead that is origin's (its earlier write, whose ack was lost) is
// written over; one of another message is ErrBatchIDTaken. It returns the
// entry's revision as last known (the write's, or the one read after a
// conflict), for the next write, whatever the error.
func (s *Store) PutEntry(ctx context.Context, batchID, origin string, rev uint64, v []byte) (uint64, error) {
	subject := s.EntrySubject(batchID)
	for range 3 {
		m := &nats.Msg{Subject: subject, Data: v, Header: nats.Header{
			HeaderBatchOrigin:                   {origin},
			jetstream.ExpectedLastSubjSeqHeader: {strconv.FormatUint(rev, 10)},
		}}
		pctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
		ack, err := s.js.PublishMsg(pctx, m)
		cancel()
		if natserr.Classify(err) == natserr.Conflict {
			gctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
			r, takenBy, gerr := s.entryRev(gctx, subject, origin)
			cancel()
			switch {
			case gerr != nil:
				return rev, gerr
			case takenBy != "":
				return rev, fmt.Errorf("%w: the entry keeps message %q's outcomes", ErrBatchIDTaken, takenBy)
			}
			rev = r
			continue
		}
		if err != nil {
			return rev, err
		}
		s.NoteKept(subject, ack.Sequence)
		return ack.Sequence, nil
	}
	return rev, errors.New("the batch's entry kept changing under its write")
}

// ReadEntry reads batch batchID's entry as the results stream's leader
// holds it (entryGet):
// its data, nil when it has none (never written, expired, removed). An
// error means the read failed (try again).
func (s *Store) ReadEntry(ctx context.Context, batchID string) ([]byte, error) {
	sm, err := s.entryGet(ctx, s.EntrySubject(batchID))
	switch {
	case errors.Is(err, ErrNoEntry):
		return nil, nil
	case err != nil:
		return nil, err
	case Removed(sm.Header):
		return nil, nil
	}
	return sm.Data, nil
}

// UnreadableError says job ID has a kept outcome that cannot be read: it
// may have finished, so it must not run again, and no retry makes the
// outcome readable. The job is dead-lettered (the owner's replay).
type UnreadableError struct {
	ID  string
	Err error
}

func (e *UnreadableError) Error() string {
	return "keylane: kept outcome of job " + e.ID + " is unreadable, so it is not run again: " + e.Err.Error()
}

func (e *UnreadableError) Unwrap() error { return e.Err }

// entryGet reads the last message on subject as the results stream's
// leader holds it (ErrNoEntry: none). On a one-replica stream
// (Config.Single) that is a direct get, which its one server answers: a
// header read, where a leader get is a JSON API request the server
// queues, decodes and answers in JSON. Any answer to the direct get but
// the message or "not found" (direct gets not allowed, no responder, a
// status, a message of another subject) is asked again of the leader; a
// read that outlives ctx is an error, as a leader get's is.
// On a replicated stream it is a leader get: a follower behind may answer
// a direct get "not found" for an entry its leader holds.
//
// A mirror of the results stream made with mirror_direct answers direct
// gets too and may be behind: a stale "not found" from it makes a claim
// that read no entry, as a failed read does (the tenure's claimBatchID):
// the batch runs, and its entry's write, which compares, still never
// writes over another message's entry; and a redelivered batch whose
// jobs look their outcomes up in its entry (ReadEntry, read once per
// batch message) finds none there and is answered from its jobs' held
// outcomes (a Reducer's state, an Applier's database) instead.
func (s *Store) entryGet(ctx context.Context, subject string) (*StoredMsg, error) {
	if s.single {
		m, err := s.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+s.stream+"."+subject, nil)
		if err == nil {
			switch m.Header.Get("Status") {
			case "404":
				return nil, ErrNoEntry
			case "":
				seq, perr := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
				if perr == nil && seq > 0 && m.Header.Get(jetstream.SubjectHeader) == subject {
					return &StoredMsg{Subject: subject, Seq: seq, Header: m.Header, Data: m.Data}, nil
				}
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return LeaderGet(ctx, s.nc, s.stream, subject)
}
