package keylane

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// DeadLetter is one message of the namespace's dead-letter stream: a job
// that failed permanently, ran out of attempts, or was not a valid job.
type DeadLetter struct {
	// Seq is the dead letter's sequence in the dead-letter stream.
	Seq   uint64
	JobID string
	Key   string
	Type  string
	// Payload is the job's payload; nil if it was dropped to fit the
	// dead letter into max_payload (PayloadDropped then says how long it
	// was).
	Payload        []byte
	PayloadDropped int
	// Error is why the job was dead-lettered; Attempts how often it ran.
	Error    string
	Attempts int
	// Worker, Partition, JobSeq and Fence say where and under which
	// tenure it failed.
	Worker    string
	Partition int
	JobSeq    uint64
	Fence     uint64
	// Time is when it was dead-lettered (the dead-letter stream's clock).
	Time time.Time
}

// DeadLetters lists up to limit dead letters of a namespace, oldest
// first, from sequence from on (0: the first). It only reads.
func DeadLetters(ctx context.Context, js jetstream.JetStream, namespace string, from uint64, limit int) ([]DeadLetter, error) {
	s, err := deadStream(ctx, js, namespace)
	if err != nil {
		return nil, err
	}
	ictx, cancel := context.WithTimeout(ctx, requestTimeout)
	info, err := s.Info(ictx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	var out []DeadLetter
	// An empty stream that never held a message says first 0, last 0.
	for seq := max(from, info.State.FirstSeq, 1); info.State.Msgs > 0 && seq <= info.State.LastSeq && len(out) < limit; seq++ {
		d, err := readDead(ctx, s, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted: redriven or purged one by one
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// DeadLetterAt reads one dead letter by its sequence.
func DeadLetterAt(ctx context.Context, js jetstream.JetStream, namespace string, seq uint64) (DeadLetter, error) {
	s, err := deadStream(ctx, js, namespace)
	if err != nil {
		return DeadLetter{}, err
	}
	return readDead(ctx, s, seq)
}

// PurgeDeadLetters removes every dead letter of a namespace stored when
// it reads the stream (PurgeDeadLettersThrough its last sequence) and
// returns how many there were.
func PurgeDeadLetters(ctx context.Context, js jetstream.JetStream, namespace string) (uint64, error) {
	s, err := deadStream(ctx, js, namespace)
	if err != nil {
		return 0, err
	}
	ictx, cancel := context.WithTimeout(ctx, requestTimeout)
	info, err := s.Info(ictx)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	return info.State.Msgs, purgeThrough(ctx, s, info.State.LastSeq)
}

// PurgeDeadLettersThrough removes the dead letters of a namespace up to
// and including sequence last, in one request; later ones stay. It is
// what an operator who looked at the stream (DeadLetterSpan) asked for,
// whatever was dead-lettered since.
func PurgeDeadLettersThrough(ctx context.Context, js jetstream.JetStream, namespace string, last uint64) error {
	s, err := deadStream(ctx, js, namespace)
	if err != nil {
		return err
	}
	return purgeThrough(ctx, s, last)
}

func purgeThrough(ctx context.Context, s jetstream.Stream, last uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 2*requestTimeout)
	defer cancel()
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(last+1)); err != nil {
		return fmt.Errorf("keylane: purge dead letters through %d: %w", last, err)
	}
	return nil
}

// DeadLetterSpan reports how many dead letters a namespace holds and the
// sequences of the first and last. It only reads.
func DeadLetterSpan(ctx context.Context, js jetstream.JetStream, namespace string) (n, first, last uint64, err error) {
	s, err := deadStream(ctx, js, namespace)
	if err != nil {
		return 0, 0, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	return info.State.Msgs, info.State.FirstSeq, info.State.LastSeq, nil
}

// DeleteDeadLetter removes one dead letter by its sequence. A sequence
// that holds none (never, or deleted already) returns an error wrapping
// jetstream.ErrMsgNotFound.
func DeleteDeadLetter(ctx context.Context, js jetstream.JetStream, namespace string, seq uint64) error {
	s, err := deadStream(ctx, js, namespace)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := s.DeleteMsg(ctx, seq); noMessage(err) {
		return fmt.Errorf("keylane: delete dead letter %d: %w", seq, jetstream.ErrMsgNotFound)
	} else if err != nil {
		return fmt.Errorf("keylane: delete dead letter %d: %w", seq, err)
	}
	return nil
}

// noMessage reports whether a delete found no message at its sequence
// (deleted already): the server answers error 10057 "no message found",
// which nats.go passes on only as text after ErrMsgDeleteUnsuccessful.
func noMessage(err error) bool {
	return errors.Is(err, jetstream.ErrMsgNotFound) ||
		errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) && strings.Contains(err.Error(), "err_code=10057") && strings.Contains(err.Error(), "no message found")
}

// Redrive submits a dead-lettered job again, as a new job of the same key,
// type and payload, and deletes the dead letter once the new job is
// stored. The new job's ID is derived from the dead letter (redriving the
// same dead letter twice stores one job). When the dead letter has a job
// ID, Redrive first writes a redrive ticket into the results bucket (an
// operator's permission: a client's cannot) and the new job names the
// original (Keylane-Redrive-Of): the worker, finding the ticket, keeps the
// new outcome under the original ID too, so Client.Result of the original
// job, or a Call retried with its ID, sees it instead of the dead
// letter's. A dead letter without a job ID (its producer sent none) is
// redriven under an ID derived from its sequence and partition. It
// returns the new job's ID.
//
// A batch message dead-lettered whole (DeadLetter.IsBatch) is redriven
// job by job, in its order, each as Redrive does one job: checked by the
// rules Submit applies, routed to its key's partition with the client's
// partition count, under an ID derived from the dead letter and its index,
// with its own ticket when it names its batch's ID
// (DeadLetter.RedriveJobs says what it submits). The dead letter is
// deleted only once every job is stored; on a failure Redrive stops
// there (a key's later jobs are never stored before its earlier ones) and
// the dead letter stays: redriving it again stores the rest, and none of
// the jobs stored already twice (their IDs are the same). A batch whose
// body does not decode is ErrMalformedBatch, one holding a job no client
// could send is refused whole: nothing is stored and the dead letter
// stays. It returns the new jobs' IDs in the batch's order, separated by
// commas (no job ID holds one).
func (c *Client) Redrive(ctx context.Context, d DeadLetter) (string, error) {
	jobs, err := d.RedriveJobs()
	if err != nil {
		return "", err
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		if err := c.redriveJob(ctx, j); err != nil {
			if d.IsBatch() {
				return "", fmt.Errorf("keylane: redrive dead letter %d: job %d of the batch's %d (key %q): %w (the %d before it stored; the dead letter stays: redrive it again, no job is stored twice)", d.Seq, i, len(jobs), j.Key, err, i)
			}
			return "", fmt.Errorf("keylane: redrive dead letter %d: %w", d.Seq, err)
		}
		ids[i] = j.ID
	}
	id := strings.Join(ids, ",")
	s, err := deadStream(ctx, c.js, c.names.Namespace)
	if err != nil {
		return id, err
	}
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := s.DeleteMsg(dctx, d.Seq); err != nil && !noMessage(err) {
		return id, fmt.Errorf("keylane: redrove dead letter %d as %s, but could not delete it: %w", d.Seq, id, err)
	}
	return id, nil
}

func deadStream(ctx context.Context, js jetstream.JetStream, namespace string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s, err := js.Stream(ctx, Names{Namespace: namespace}.Dead())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("keylane: namespace %s has no dead-letter stream: %w", namespace, ErrNoTopology)
	}
	if err != nil {
		return nil, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	return s, nil
}

func readDead(ctx context.Context, s jetstream.Stream, seq uint64) (DeadLetter, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, err
	}
	h := m.Header
	atoi := func(k string) int { n, _ := strconv.Atoi(h.Get(k)); return n }
	atou := func(k string) uint64 { n, _ := strconv.ParseUint(h.Get(k), 10, 64); return n }
	id := wire.JobIDOfDead(h)
	return DeadLetter{
		Seq: m.Sequence, JobID: id, Key: h.Get(HeaderKey), Type: h.Get(HeaderType),
		Payload: m.Data, PayloadDropped: atoi(HeaderPayloadDropped),
		Error: h.Get(HeaderError), Attempts: atoi(HeaderAttempts), Worker: h.Get(HeaderWorker),
		Partition: atoi(HeaderPartition), JobSeq: atou(HeaderSeq), Fence: atou(HeaderFence), Time: m.Time,
	}, nil
}
