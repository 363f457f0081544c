package keylane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

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
	for seq := max(from, info.State.FirstSeq); seq <= info.State.LastSeq && len(out) < limit; seq++ {
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

// PurgeDeadLetters removes every dead letter of a namespace and returns
// how many there were.
func PurgeDeadLetters(ctx context.Context, js jetstream.JetStream, namespace string) (uint64, error) {
	s, err := deadStream(ctx, js, namespace)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*requestTimeout)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	if err := s.Purge(ctx); err != nil {
		return 0, fmt.Errorf("keylane: purge dead letters: %w", err)
	}
	return info.State.Msgs, nil
}

// Redrive submits a dead-lettered job again, as a new job of the same key,
// type and payload, and deletes the dead letter once the new job is
// stored. The new job's ID is derived from the dead letter (redriving the
// same dead letter twice stores one job), and it carries the original ID
// (Keylane-Redrive-Of): the worker keeps its outcome under the original ID
// too, so Client.Result of the original job, or a Call retried with its
// ID, sees the new outcome instead of the dead letter's. It returns the new
// job's ID.
func (c *Client) Redrive(ctx context.Context, d DeadLetter) (string, error) {
	if d.PayloadDropped > 0 {
		return "", fmt.Errorf("%w (dead letter %d, job %s)", ErrPayloadDropped, d.Seq, d.JobID)
	}
	if err := ValidateJobID(d.JobID); err != nil {
		return "", fmt.Errorf("keylane: dead letter %d: %w", d.Seq, err)
	}
	id := redriveID(d)
	opts := []SubmitOpt{WithID(id), withRedriveOf(d.JobID)}
	if d.Type != "" {
		opts = append(opts, WithType(d.Type))
	}
	if _, err := c.Submit(ctx, d.Key, d.Payload, opts...); err != nil && !errors.Is(err, ErrDuplicate) {
		return "", fmt.Errorf("keylane: redrive dead letter %d: %w", d.Seq, err)
	}
	s, err := deadStream(ctx, c.js, c.names.Namespace)
	if err != nil {
		return id, err
	}
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := s.DeleteMsg(dctx, d.Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return id, fmt.Errorf("keylane: redrove dead letter %d as %s, but could not delete it: %w", d.Seq, id, err)
	}
	return id, nil
}

// redriveID is the redriven job's ID: the original's with the dead
// letter's sequence, or a digest of the original when that is too long.
func redriveID(d DeadLetter) string {
	id := d.JobID + ".redrive-" + strconv.FormatUint(d.Seq, 10)
	if ValidateJobID(id) != nil {
		sum := sha256.Sum256([]byte(d.JobID))
		id = "redrive-" + strconv.FormatUint(d.Seq, 10) + "-" + hex.EncodeToString(sum[:12])
	}
	return id
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
	return DeadLetter{
		Seq: m.Sequence, JobID: h.Get(HeaderJobID), Key: h.Get(HeaderKey), Type: h.Get(HeaderType),
		Payload: m.Data, PayloadDropped: atoi(HeaderPayloadDropped),
		Error: h.Get(HeaderError), Attempts: atoi(HeaderAttempts), Worker: h.Get(HeaderWorker),
		Partition: atoi(HeaderPartition), JobSeq: atou(HeaderSeq), Fence: atou(HeaderFence), Time: m.Time,
	}, nil
}
