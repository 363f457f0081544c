package keylane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The kept outcomes of a group's jobs with a caller's ID are looked up in
// one batched direct get on the results bucket's stream (nats-server 2.11+:
// a request {"multi_last": [subjects…]} on $JS.API.DIRECT.GET.<stream> is
// answered by the last message of each subject that has one, then a 204
// EOB status; by one 404 No Results when none has). Any replica may answer
// a direct get, a follower from what it has applied so far, so the answer
// is trusted only in the direction a stale replica cannot get wrong: an
// outcome it has is kept (outcomes are never deleted, see keptMark), but
// "none kept" counts only when the replica is shown current: its EOB's
// Nats-UpTo-Sequence (its last sequence) is at or past this tenure's
// newest kept outcome, which the request also asks for so the answer is
// never a bare 404. Everything else is left to the per-ID look-up
// (storedResult), a get the stream's leader answers, retried with backoff
// while the tenure lasts. See jetstream/doc.go, "Reads that decide" and
// "Retries by job ID".
const (
	// lookUpBatchMax is the server's cap on entries per multi_last answer,
	// less one for the tenure's mark (keptMark).
	lookUpBatchMax = 1024 - 1
	// keptBatchOffFor is how long a worker whose server refused the batched
	// form (an older server, a permission, a bucket without direct gets)
	// looks outcomes up one ID at a time before it tries the batch again.
	keptBatchOffFor = time.Minute
)

// keptBatchRequest is the JSON of a batched direct get (nats-server's
// JSApiMsgGetRequest, the fields we use).
type keptBatchRequest struct {
	MultiLast []string `json:"multi_last"`
	Batch     int      `json:"batch"`
}

// errKeptBatchRefused says the server refused the batched form itself, as
// opposed to failing one request: the worker stops asking for a while.
var errKeptBatchRefused = errors.New("keylane: batched look-up refused")

// lookUpKeptBatch resolves, with one request per up to lookUpBatchMax IDs,
// the kept outcomes of the tasks of ts that have a caller's ID and were
// not looked up yet this tenure: it sets t.kept (found) or t.lookedUp (a
// definite "none"), and leaves a task untouched when the answer about its
// ID was not definite, for the per-ID look-up to settle.
func (o *owner) lookUpKeptBatch(ts []*task) {
	if off := o.w.keptBatchOff.Load(); off != 0 && time.Now().UnixNano() < off {
		return
	}
	// One ID is one plain direct get (storedResult): the batched form
	// would add an inbox subscription and a JSON body for nothing, and
	// groups of one are the common case with many keys.
	pending := 0
	for _, t := range ts {
		if t.explicit && !t.lookedUp && t.kept == nil && batchableID(t.job.ID) {
			if pending++; pending == 2 {
				break
			}
		}
	}
	if pending < 2 {
		return
	}
	prefix := "$KV." + o.w.topo.Names.Results() + "."
	byID := map[string][]*task{}
	var subjects []string
	size := 0
	flush := func() bool {
		if len(subjects) == 0 {
			return true
		}
		err := o.keptBatch(prefix, subjects, byID)
		subjects, size = subjects[:0], 0
		clear(byID)
		return !errors.Is(err, errKeptBatchRefused)
	}
	// A request stays well under max_payload (IDs are at most 256 bytes).
	maxBytes := int(o.w.nc.MaxPayload()) - 1024
	for _, t := range ts {
		if !t.explicit || t.lookedUp || t.kept != nil || !batchableID(t.job.ID) {
			continue
		}
		id := t.job.ID
		if _, ok := byID[id]; !ok {
			s := prefix + id
			if len(subjects) == lookUpBatchMax || size+len(s)+3 > maxBytes {
				if !flush() {
					return
				}
			}
			subjects = append(subjects, s)
			size += len(s) + 3
		}
		byID[id] = append(byID[id], t)
	}
	flush()
}

// keptMark is the newest outcome this tenure kept: its subject in the
// results bucket and its stream sequence. The previous owners' outcomes
// were all stored before this tenure's first (their leases ended before
// ours began), and this tenure's before it looks anything up again, so a
// replica whose last sequence is at or past seq has every outcome a
// look-up must see.
type keptMark struct {
	subject string
	seq     uint64
}

// noteKept records that an outcome was stored under subject at seq.
func (o *owner) noteKept(subject string, seq uint64) {
	for {
		cur := o.mark.Load()
		if cur != nil && cur.seq >= seq {
			return
		}
		if o.mark.CompareAndSwap(cur, &keptMark{subject: subject, seq: seq}) {
			return
		}
	}
}

// currentMark returns the tenure's keptMark; until the tenure kept an
// outcome, the results stream's newest message as its leader says (one
// leader get, until one succeeds): every earlier owner's outcome lies at
// or below it. A stream with no message gives a mark with no subject: any
// complete answer is current. nil means not known (the get failed).
func (o *owner) currentMark() *keptMark {
	if m := o.mark.Load(); m != nil {
		return m
	}
	ctx, cancel := context.WithTimeout(o.ctx, resultLookupTimeout)
	defer cancel()
	results := o.w.topo.Names.Results()
	sm, err := leaderGet(ctx, o.w.nc, "KV_"+results, "$KV."+results+".>")
	switch {
	case errors.Is(err, errNoEntry):
		o.mark.CompareAndSwap(nil, &keptMark{})
	case err != nil:
		return nil
	default:
		o.noteKept(sm.Subject, sm.Seq)
	}
	return o.mark.Load()
}

// batchableID reports whether id may name a subject in a batched look-up:
// a valid job ID whose dot-separated tokens are all non-empty. Others are
// left to the per-ID look-up, as before.
func batchableID(id string) bool {
	if _, _, ok := wire.ParseBatchedJobID(id); ok {
		return false // looked for in its batch too (storedResult)
	}
	return ValidateJobID(id) == nil && !strings.Contains(id, "..")
}

// keptBatch sends one batched direct get for subjects and settles the
// tasks of byID it answers definitely. It returns errKeptBatchRefused (and
// turns the batched form off for keptBatchOffFor) when the server refused
// the form, any other error when the answer was not definite; a task whose
// ID the answer did not settle is left untouched either way.
func (o *owner) keptBatch(prefix string, subjects []string, byID map[string][]*task) error {
	mark := o.currentMark()
	found, upTo, err := o.keptBatchRequest(prefix, subjects, mark)
	if errors.Is(err, errKeptBatchRefused) {
		o.w.keptBatchOff.Store(time.Now().Add(keptBatchOffFor).UnixNano())
		o.log.Warn("batched kept-outcome look-up refused; looking up one ID at a time for a while", "for", keptBatchOffFor, "err", err)
		return err
	}
	if err != nil {
		if o.ctx.Err() == nil { // else the tenure ended: nothing to say
			o.log.Warn("batched kept-outcome look-up failed; looking up one ID at a time", "jobs", len(subjects), "err", err)
		}
		return err
	}
	for id := range found {
		if byID[id] == nil {
			o.log.Warn("batched kept-outcome look-up answered an ID not asked for; looking up one ID at a time", "job_id", id)
			return errors.New("keylane: batched look-up answered an ID not asked for")
		}
	}
	// "None kept" is definite only from a replica that has applied this
	// tenure's newest outcome, and so every outcome kept before. So is a
	// dead-lettered outcome: the one outcome that changes (a redrive keeps
	// the redriven job's under the original ID), and a replica behind may
	// not have the new one yet. Every other kept outcome is final as it
	// comes.
	current := mark != nil && (mark.subject == "" || upTo >= mark.seq)
	for id, tasks := range byID {
		k, ok := found[id]
		for _, t := range tasks {
			switch {
			case ok && k != nil && (current || !k.deadLettered()):
				t.kept = k
			case current:
				t.lookedUp = true
			}
		}
	}
	return nil
}

// deadLettered reports whether k is a dead-lettered job's outcome.
func (k *keptOutcome) deadLettered() bool {
	var re *RemoteError
	return errors.As(k.err, &re) && re.DeadLettered
}

// keptBatchRequest makes the request and collects its answer: for each ID
// with a kept outcome its decoded outcome, for each ID whose last entry is
// a delete, purge or an undecodable value nil (none kept, as storedResult
// says), and the answering replica's last sequence (0 if its answer did
// not say). The request also asks for mark's subject, if any. It returns
// an error unless the answer was complete.
func (o *owner) keptBatchRequest(prefix string, subjects []string, mark *keptMark) (map[string]*keptOutcome, uint64, error) {
	extra := "" // asked for only to learn how current the replica is
	if mark != nil && mark.subject != "" && !slices.Contains(subjects, mark.subject) {
		extra = mark.subject
		subjects = append(subjects[:len(subjects):len(subjects)], extra)
	}
	body, err := json.Marshal(keptBatchRequest{MultiLast: subjects, Batch: len(subjects)})
	if err != nil {
		return nil, 0, err
	}
	nc := o.w.nc
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
	ctx, cancel := context.WithTimeout(o.ctx, resultLookupTimeout)
	defer cancel()
	subject := "$JS.API.DIRECT.GET.KV_" + o.w.topo.Names.Results()
	probe := !o.w.keptBatchProbed.Load()
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
			return nil, 0, fmt.Errorf("%w: %v", errKeptBatchRefused, nc.LastError())
		}
		o.w.keptBatchProbed.Store(true)
	}
	found, upTo, err := readKeptAnswer(prefix, extra, func() (*nats.Msg, error) {
		select {
		case m := <-ch:
			return m, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	if err != nil && refusedPublish(nc.LastError(), lastErr, subject) {
		return nil, 0, fmt.Errorf("%w: %v", errKeptBatchRefused, nc.LastError())
	}
	if n, derr := sub.Dropped(); err == nil && (derr != nil || n > 0) {
		// An entry lost on the way would read as "not kept": unknown.
		return nil, 0, fmt.Errorf("keylane: batched look-up lost %d answers (%v)", n, derr)
	}
	return found, upTo, err
}

// readKeptAnswer reads the messages of a batched direct get's answer from
// next until its end: the outcomes by ID (nil: none kept) and the
// answering replica's last sequence (the EOB's Nats-UpTo-Sequence; 0 for a
// 404 No Results, or a server that does not say) after a 204 EOB with
// nothing pending or a 404 No Results, else an error (and
// errKeptBatchRefused for a 408 or 503). The entry for subject extra, if
// not empty, is no outcome and is left out.
func readKeptAnswer(prefix, extra string, next func() (*nats.Msg, error)) (map[string]*keptOutcome, uint64, error) {
	found := map[string]*keptOutcome{}
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
			id, k, err := keptEntry(m, prefix)
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
			return nil, 0, fmt.Errorf("%w: status %s %s", errKeptBatchRefused, status, desc)
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

// keptEntry reads one message of a batched answer: the ID it is for and
// its outcome (keptValue).
func keptEntry(m *nats.Msg, prefix string) (string, *keptOutcome, error) {
	subj := m.Header.Get("Nats-Subject")
	id, ok := strings.CutPrefix(subj, prefix)
	if !ok || ValidateJobID(id) != nil {
		return "", nil, fmt.Errorf("keylane: batched look-up answered subject %q", subj)
	}
	if _, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64); err != nil {
		return "", nil, fmt.Errorf("keylane: batched look-up answered %s without a sequence", subj)
	}
	return id, keptValue(id, m.Header, m.Data), nil
}

// keptValue reads the last entry of job id in the results bucket: its
// outcome, or nil when the entry says none is kept (a delete or purge
// marker, as kv.Get's ErrKeyDeleted). A value decodeResult does not read
// is an outcome too, whose err is an *unreadableOutcomeError: the job may
// have finished, so replay dead-letters it rather than run it again.
// Before, it read as none kept and the job ran a second time
// (TestGarbledKeptOutcomeByIDNeverRunsTheJobAgain).
func keptValue(id string, h nats.Header, data []byte) *keptOutcome {
	if kvRemoved(h) {
		return nil
	}
	res, rerr, ok := decodeResult(data)
	if !ok {
		return &keptOutcome{err: &unreadableOutcomeError{id: id, err: fmt.Errorf("its entry by ID (%d bytes) does not decode", len(data))}}
	}
	return &keptOutcome{res: res, err: rerr}
}

// kvRemoved reports whether a KV entry with headers h says its key has
// no value: a delete or purge marker (kv.Get's ErrKeyDeleted), or a
// server's marker for a removed message.
func kvRemoved(h nats.Header) bool {
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

// errNoEntry is a leader get's "no message" (the key was never written,
// or its entries expired).
var errNoEntry = errors.New("keylane: no entry")

// storedMsg is a message as a leader get returns it.
type storedMsg struct {
	Subject string      `json:"subject"`
	Seq     uint64      `json:"seq"`
	Hdrs    []byte      `json:"hdrs"`
	Data    []byte      `json:"data"`
	Header  nats.Header `json:"-"`
}

// leaderGet reads the last message on subject (a wildcard: the newest of
// those it matches) of stream with a get its leader answers
// ($JS.API.STREAM.MSG.GET, never a direct get, which any replica answers
// from what it has applied): it cannot miss a message the stream
// acknowledged before the request. It returns errNoEntry when there is
// none.
func leaderGet(ctx context.Context, nc *nats.Conn, stream, subject string) (*storedMsg, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *storedMsg          `json:"message"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("keylane: bad answer to a get on %s: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, errNoEntry
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("keylane: a get on %s answered no message", stream)
	}
	sm := resp.Message
	if len(sm.Hdrs) > 0 {
		if sm.Header, err = nats.DecodeHeadersMsg(sm.Hdrs); err != nil {
			return nil, fmt.Errorf("keylane: a get on %s answered bad headers: %w", stream, err)
		}
	}
	return sm, nil
}
