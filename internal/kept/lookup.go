package kept

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// The kept outcomes of a group's jobs with a caller's ID are looked up in
// one batched direct get on the results bucket's stream (nats-server 2.11+:
// a request {"multi_last": [subjects…]} on $JS.API.DIRECT.GET.<stream> is
// answered by the last message of each subject that has one, then a 204
// EOB status; by one 404 No Results when none has). Any replica may answer
// a direct get, a follower from what it has applied so far, so the answer
// is trusted only in the direction a stale replica cannot get wrong: an
// outcome it has is kept (outcomes are never deleted, see mark), but
// "none kept" counts only when the replica is shown current: its EOB's
// Nats-UpTo-Sequence (its last sequence) is at or past this tenure's
// newest kept outcome, which the request also asks for so the answer is
// never a bare 404. Everything else is left to the per-ID look-up (the
// caller's, with LeaderGet), a get the stream's leader answers, retried
// with backoff while the tenure lasts. See jetstream/doc.go, "Reads that
// decide" and "Retries by job ID".
const (
	// lookUpBatchMax is the server's cap on entries per multi_last answer,
	// less one for the tenure's mark.
	lookUpBatchMax = 1024 - 1
	// lookUpOffFor is how long a worker whose server refused the batched
	// form (an older server, a permission, a bucket without direct gets)
	// looks outcomes up one ID at a time before it tries the batch again.
	lookUpOffFor = time.Minute
)

// multiLastRequest is the JSON of a batched direct get (nats-server's
// JSApiMsgGetRequest, the fields we use).
type multiLastRequest struct {
	MultiLast []string `json:"multi_last"`
	Batch     int      `json:"batch"`
}

// errLookUpRefused says the server refused the batched form itself, as
// opposed to failing one request: the worker stops asking for a while.
var errLookUpRefused = errors.New("keylane: batched look-up refused")

// LookUp resolves, with one request per up to lookUpBatchMax IDs, the kept
// outcomes of ids (job IDs with a caller's ID not looked up yet this
// tenure; an ID may come more than once). It returns, for each ID the
// answer settled, its outcome (found) or nil (a definite "none kept"); an
// ID the answer did not settle definitely is left out, for the per-ID
// look-up to settle. Fewer than two IDs the batch may name, or the batched
// form off after a refusal, settle nothing: one ID is one plain get.
func (s *Store) LookUp(ctx context.Context, ids []string) map[string]*Outcome {
	if off := s.mem.lookUpOff.Load(); off != 0 && time.Now().UnixNano() < off {
		return nil
	}
	// One ID is one plain direct get (the per-ID look-up): the batched
	// form would add an inbox subscription and a JSON body for nothing,
	// and groups of one are the common case with many keys.
	pending := 0
	for _, id := range ids {
		if batchableID(id) {
			if pending++; pending == 2 {
				break
			}
		}
	}
	if pending < 2 {
		return nil
	}
	settled := map[string]*Outcome{}
	asked := map[string]bool{}
	var subjects []string
	size := 0
	flush := func() bool {
		if len(subjects) == 0 {
			return true
		}
		err := s.lookUpBatch(ctx, subjects, asked, settled)
		subjects, size = subjects[:0], 0
		clear(asked)
		return !errors.Is(err, errLookUpRefused)
	}
	// A request stays well under max_payload (IDs are at most 256 bytes).
	maxBytes := int(s.nc.MaxPayload()) - 1024
	for _, id := range ids {
		if !batchableID(id) {
			continue
		}
		if !asked[id] {
			subj := s.prefix + id
			if len(subjects) == lookUpBatchMax || size+len(subj)+3 > maxBytes {
				if !flush() {
					return settled
				}
			}
			subjects = append(subjects, subj)
			size += len(subj) + 3
		}
		asked[id] = true
	}
	flush()
	return settled
}

// batchableID reports whether id may name a subject in a batched look-up:
// a valid job ID whose dot-separated tokens are all non-empty. Others are
// left to the per-ID look-up, as before.
func batchableID(id string) bool {
	if _, _, ok := wire.ParseBatchedJobID(id); ok {
		return false // looked for in its batch too (the per-ID look-up)
	}
	return wire.ValidateJobID(id) == nil && !strings.Contains(id, "..")
}

// lookUpBatch sends one batched direct get for subjects and settles in
// settled the IDs of asked it answers definitely. It returns
// errLookUpRefused (and turns the batched form off for lookUpOffFor) when
// the server refused the form, any other error when the answer was not
// definite; an ID the answer did not settle is left out either way.
func (s *Store) lookUpBatch(ctx context.Context, subjects []string, asked map[string]bool, settled map[string]*Outcome) error {
	m := s.currentMark(ctx)
	found, upTo, err := s.lookUpRequest(ctx, subjects, m)
	if errors.Is(err, errLookUpRefused) {
		s.mem.lookUpOff.Store(time.Now().Add(lookUpOffFor).UnixNano())
		s.log.Warn("batched kept-outcome look-up refused; looking up one ID at a time for a while", "for", lookUpOffFor, "err", err)
		return err
	}
	if err != nil {
		if ctx.Err() == nil { // else the tenure ended: nothing to say
			s.log.Warn("batched kept-outcome look-up failed; looking up one ID at a time", "jobs", len(subjects), "err", err)
		}
		return err
	}
	for id := range found {
		if !asked[id] {
			s.log.Warn("batched kept-outcome look-up answered an ID not asked for; looking up one ID at a time", "job_id", id)
			return errors.New("keylane: batched look-up answered an ID not asked for")
		}
	}
	// "None kept" is definite only from a replica that has applied this
	// tenure's newest outcome, and so every outcome kept before. So is a
	// dead-lettered outcome: the one outcome that changes (a redrive keeps
	// the redriven job's under the original ID), and a replica behind may
	// not have the new one yet. Every other kept outcome is final as it
	// comes.
	current := m != nil && (m.subject == "" || upTo >= m.seq)
	for id := range asked {
		k, ok := found[id]
		switch {
		case ok && k != nil && (current || !k.deadLettered()):
			settled[id] = k
		case current:
			settled[id] = nil
		}
	}
	return nil
}

// deadLettered reports whether k is a dead-lettered job's outcome.
func (k *Outcome) deadLettered() bool {
	var re *core.RemoteError
	return errors.As(k.Err, &re) && re.DeadLettered
}

// lookUpRequest makes the request and collects its answer: for each ID
// with a kept outcome its decoded outcome, for each ID whose last entry is
// a delete, purge or an undecodable value nil (none kept, as the per-ID
// look-up says), and the answering replica's last sequence (0 if its
// answer did not say). The request also asks for m's subject, if any. It
// returns an error unless the answer was complete.
func (s *Store) lookUpRequest(ctx context.Context, subjects []string, m *mark) (map[string]*Outcome, uint64, error) {
	extra := "" // asked for only to learn how current the replica is
	if m != nil && m.subject != "" && !slices.Contains(subjects, m.subject) {
		extra = m.subject
		subjects = append(subjects[:len(subjects):len(subjects)], extra)
	}
	body, err := json.Marshal(multiLastRequest{MultiLast: subjects, Batch: len(subjects)})
	if err != nil {
		return nil, 0, err
	}
	nc := s.nc
	inbox := nc.NewInbox()
	// The server answers with at most len(subjects) entries (the request's
	// batch) and one closing status: a channel that holds them all never
	// drops one. (SubscribeSync would allocate nats.go's default 64k-slot
	// channel, 512 KiB cleared per group: a tenth of a hot worker's CPU.)
	ch := make(chan *nats.Msg, len(subjects)+2)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	ctx, cancel := context.WithTimeout(ctx, core.ResultLookupTimeout)
	defer cancel()
	subject := "$JS.API.DIRECT.GET." + s.stream
	probe := !s.mem.probed.Load()
	lastErr := nc.LastError()
	if err := nc.PublishRequest(subject, inbox, body); err != nil {
		return nil, 0, err
	}
	if probe {
		// A publish the user may not make is only told asynchronously
		// (-ERR, the connection's last error): the first request of a
		// worker checks for it with a round trip, so a refused form costs
		// one probe, not a timeout per group.
		if err := nc.FlushWithContext(ctx); err != nil {
			return nil, 0, err
		}
		if refusedPublish(nc.LastError(), lastErr, subject) {
			return nil, 0, fmt.Errorf("%w: %v", errLookUpRefused, nc.LastError())
		}
		s.mem.probed.Store(true)
	}
	found, upTo, err := readAnswer(s.prefix, extra, func() (*nats.Msg, error) {
		select {
		case m := <-ch:
			return m, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	if err != nil && refusedPublish(nc.LastError(), lastErr, subject) {
		return nil, 0, fmt.Errorf("%w: %v", errLookUpRefused, nc.LastError())
	}
	if n, derr := sub.Dropped(); err == nil && (derr != nil || n > 0) {
		// An entry lost on the way would read as "not kept": unknown.
		return nil, 0, fmt.Errorf("keylane: batched look-up lost %d answers (%v)", n, derr)
	}
	return found, upTo, err
}

// readAnswer reads the messages of a batched direct get's answer from
// next until its end: the outcomes by ID (nil: none kept) and the
// answering replica's last sequence (the EOB's Nats-UpTo-Sequence; 0 for a
// 404 No Results, or a server that does not say) after a 204 EOB with
// nothing pending or a 404 No Results, else an error (and
// errLookUpRefused for a 408 or 503). The entry for subject extra, if not
// empty, is no outcome and is left out.
func readAnswer(prefix, extra string, next func() (*nats.Msg, error)) (map[string]*Outcome, uint64, error) {
	found := map[string]*Outcome{}
	entries := 0
	for {
		m, err := next()
		if err != nil {
			return nil, 0, err
		}
		status, desc := m.Header.Get("Status"), m.Header.Get("Description")
		switch {
		case status == "" && extra != "" && m.Header.Get("Nats-Subject") == extra:
			entries++
		case status == "":
			entries++
			id, k, err := answerEntry(m, prefix)
			if err != nil {
				return nil, 0, err
			}
			if _, dup := found[id]; dup {
				return nil, 0, fmt.Errorf("keylane: batched look-up answered %s twice", id)
			}
			found[id] = k
		case status == "204" && desc == "EOB":
			if np := m.Header.Get("Nats-Num-Pending"); np != "0" {
				// Cut short (the server's max bytes): the rest is unknown.
				return nil, 0, fmt.Errorf("keylane: batched look-up cut short with %q pending", np)
			}
			if entries == 0 {
				return nil, 0, errors.New("keylane: batched look-up ended with no entries")
			}
			upTo, _ := strconv.ParseUint(m.Header.Get("Nats-UpTo-Sequence"), 10, 64)
			return found, upTo, nil
		case status == "404" && desc == "No Results" && entries == 0:
			return found, 0, nil
		case status == "408" || status == "503":
			// 408: a server before 2.11 reads no request in the JSON; 503:
			// nobody answers direct gets on the bucket's stream.
			return nil, 0, fmt.Errorf("%w: status %s %s", errLookUpRefused, status, desc)
		default:
			return nil, 0, fmt.Errorf("keylane: batched look-up answered status %s %s", status, desc)
		}
	}
}

// refusedPublish reports whether the connection's last error, new since
// before, is a permissions violation for publishing to subject.
func refusedPublish(err, before error, subject string) bool {
	return err != nil && err != before && errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), `Publish to "`+subject+`"`)
}

// answerEntry reads one message of a batched answer: the ID it is for and
// its outcome (Value).
func answerEntry(m *nats.Msg, prefix string) (string, *Outcome, error) {
	subj := m.Header.Get("Nats-Subject")
	id, ok := strings.CutPrefix(subj, prefix)
	if !ok || wire.ValidateJobID(id) != nil {
		return "", nil, fmt.Errorf("keylane: batched look-up answered subject %q", subj)
	}
	if _, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64); err != nil {
		return "", nil, fmt.Errorf("keylane: batched look-up answered %s without a sequence", subj)
	}
	return id, Value(id, m.Header, m.Data), nil
}

// Value reads the last entry of job id in the results bucket (its
// headers h and data): its outcome, or nil when the entry says none is
// kept (a delete or purge marker, as kv.Get's ErrKeyDeleted). A value
// core.DecodeOutcome does not read is an outcome too, whose Err is an
// *UnreadableError: the job may have finished, so replay dead-letters it
// rather than run it again. Before, it read as none kept and the job ran
// a second time (TestGarbledKeptOutcomeByIDNeverRunsTheJobAgain).
func Value(id string, h nats.Header, data []byte) *Outcome {
	if Removed(h) {
		return nil
	}
	res, rerr, ok := core.DecodeOutcome(data)
	if !ok {
		return &Outcome{Err: &UnreadableError{ID: id, Err: fmt.Errorf("its entry by ID (%d bytes) does not decode", len(data))}}
	}
	return &Outcome{Res: res, Err: rerr}
}

// Removed reports whether a KV entry with headers h says its key has no
// value: a delete or purge marker (kv.Get's ErrKeyDeleted), or a server's
// marker for a removed message.
func Removed(h nats.Header) bool {
	switch h.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	case "":
		switch h.Get("Nats-Marker-Reason") {
		case "MaxAge", "Purge", "Remove":
			return true
		}
	}
	return false
}
