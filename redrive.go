package keylane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/keylane/keylane/internal/tenure"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// A redrive keeps the new job's outcome under the dead-lettered job's ID
// too: the worker writes, with its own permission, an outcome on the
// original submitter's behalf. The Keylane-Redrive-Of header a job carries
// is only a hint. The authority is a redrive ticket in the results bucket,
// under a key no job ID can be ("redrive/<new job ID>": job IDs never hold
// '/'), which only the operator's path writes: under
// docs/security/accounts.conf a client cannot publish to $KV.<NS>_RESULTS.>
// at all. The worker honours the hint only when the ticket, read from the
// results stream's leader, names this job, its key, type and payload, and
// the original ID; anywhere else the job runs as an ordinary job. See
// jetstream/doc.go, "Redrive".

// The ticket's format is the tenure's, which reads it
// (internal/tenure, redrive.go).
const (
	headerRedriveTicket = tenure.HeaderRedriveTicket
	redriveTicketPrefix = tenure.RedriveTicketPrefix
)

type redriveTicket = tenure.RedriveTicket

var payloadDigest = tenure.PayloadDigest

// writeRedriveTicket stores the ticket that lets the worker keep job j's
// outcome under j.Of too. The results bucket's TTL bounds its life.
func (c *Client) writeRedriveTicket(ctx context.Context, j RedriveJob) error {
	id := j.ID
	v, err := json.Marshal(redriveTicket{Job: id, Of: j.Of, Key: j.Key, Type: j.Type, Payload: payloadDigest(j.Payload)})
	if err != nil {
		return err
	}
	m := nats.NewMsg("$KV." + c.names.Results() + "." + redriveTicketPrefix + id)
	m.Header.Set(headerRedriveTicket, id)
	m.Data = v
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if _, err := c.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("keylane: write the redrive ticket of %s (an operator's permission: publish to $KV.%s.%s>): %w", id, c.names.Results(), redriveTicketPrefix, err)
	}
	return nil
}

// redriveID is the redriven job's ID: the same for the same dead letter,
// so redriving it twice stores one job. It is the original's ID (or, for a
// job sent without a valid one, its partition's) with the dead letter's
// sequence and a digest that takes in the time the job was dead-lettered,
// which only those who may read the dead-letter stream know: a submitter
// cannot take the ID first and have the operator's redrive dropped as a
// duplicate.
func redriveID(d DeadLetter) string { return redriveIDOf(d, d.JobID, -1) }

// batchRedriveID is redriveID for job index of a batch dead-lettered
// whole, whose own ID is of (empty when not trusted): the index is in the
// digest and the tag, so the jobs of one batch, even without IDs, never
// share one, and the same job of the same dead letter always has the
// same.
func batchRedriveID(d DeadLetter, index int, of string) string { return redriveIDOf(d, of, index) }

// redriveIDOf is redriveID of the job of ID of; index is -1 for a
// one-job dead letter (its IDs as before batches), else the job's place
// in its batch.
func redriveIDOf(d DeadLetter, of string, index int) string {
	in := fmt.Appendf(nil, "%d\x00%d\x00%d\x00%s", d.Seq, d.Partition, d.Time.UnixNano(), of)
	tag := strconv.FormatUint(d.Seq, 10)
	if index >= 0 {
		in = fmt.Appendf(in, "\x00%d", index)
		tag += "-" + strconv.Itoa(index)
	}
	sum := sha256.Sum256(in)
	tag += "-" + hex.EncodeToString(sum[:6])
	if of == "" || ValidateJobID(of) != nil {
		return "redrive-p" + strconv.Itoa(d.Partition) + "-" + tag
	}
	if id := of + ".redrive-" + tag; ValidateJobID(id) == nil {
		return id
	}
	long := sha256.Sum256([]byte(of))
	return "redrive-" + tag + "-" + hex.EncodeToString(long[:12])
}

// RedriveJob is one job Client.Redrive submits for a dead letter
// (DeadLetter.RedriveJobs).
type RedriveJob struct {
	// ID is the new job's ID, derived from the dead letter (and the job's
	// index in its batch): a redrive run again stores none of its jobs
	// twice.
	ID string
	// Of is the dead-lettered job's ID, under which the new outcome is
	// kept too (its redrive ticket); empty for none.
	Of string
	// Index is the job's place in a batch message dead-lettered whole; 0
	// for a one-job dead letter.
	Index     int
	Key, Type string
	// Header is the job's own headers, as its batch carried them (a
	// one-job dead letter's are not redriven: none).
	Header  map[string][]string
	Payload []byte
}

// IsBatch reports whether d is a batch message dead-lettered whole
// (malformed framing, a partition count other than the stream's, fetched
// by a worker that does not read batches): its payload is the batch's
// body, which starts with the batch magic, and it names no key (a batch
// has none of its own). A job's dead letter always names its key when it
// has a valid one.
func (d DeadLetter) IsBatch() bool {
	return d.Key == "" && d.PayloadDropped == 0 && wire.IsBatchBody(d.Payload)
}

// RedriveJobs returns the jobs Client.Redrive would submit for d, without
// submitting anything: the dead-lettered job, or each job of a batch
// message dead-lettered whole (IsBatch), in the batch's order. A batch
// whose body does not decode is ErrMalformedBatch; one holding a job no
// client could send (a bad key, type or header, by the rules
// Client.Submit applies) is refused whole, naming the job: redriving the
// others would leave a dead letter that can never go. A job of a batch
// names its original ID (Of) only when it is its batch's and its index's
// (wire.BatchedJobID of the batch's ID), as the worker requires of a
// batch's jobs: any other ID was the sender's choice and may be another
// caller's. For a one-job dead letter it checks only the payload
// (ErrPayloadDropped); Submit checks the rest.
func (d DeadLetter) RedriveJobs() ([]RedriveJob, error) {
	if d.PayloadDropped > 0 {
		return nil, fmt.Errorf("%w (dead letter %d, job %s)", ErrPayloadDropped, d.Seq, d.JobID)
	}
	if !d.IsBatch() {
		j := RedriveJob{ID: redriveID(d), Key: d.Key, Type: d.Type, Payload: d.Payload}
		if d.JobID != "" && ValidateJobID(d.JobID) == nil {
			j.Of = d.JobID
		}
		return []RedriveJob{j}, nil
	}
	jobs, err := wire.DecodeBatch(d.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w (dead letter %d: %w)", ErrMalformedBatch, d.Seq, err)
	}
	out := make([]RedriveJob, len(jobs))
	for i, b := range jobs {
		err := wire.ValidateKey(b.Key)
		if err == nil {
			err = wire.ValidateType(b.Type)
		}
		if err == nil {
			err = wire.ValidateUserHeaders(b.Header)
		}
		if err != nil {
			return nil, fmt.Errorf("keylane: dead letter %d: job %d of the batch cannot be submitted, so the batch is not redriven (nothing stored): %w", d.Seq, i, err)
		}
		of := ""
		if wire.ValidBatchID(d.JobID) && b.ID == wire.BatchedJobID(d.JobID, i) {
			of = b.ID
		}
		out[i] = RedriveJob{ID: batchRedriveID(d, i, of), Of: of, Index: i, Key: b.Key, Type: b.Type, Header: b.Header, Payload: b.Payload}
	}
	return out, nil
}

// redriveJob stores j, its redrive ticket first when it names an
// original ID. A job the stream has already (a redrive run again) is
// stored, not an error.
func (c *Client) redriveJob(ctx context.Context, j RedriveJob) error {
	opts := []SubmitOpt{WithID(j.ID), withHeaders(j.Header)}
	if j.Of != "" {
		if err := c.writeRedriveTicket(ctx, j); err != nil {
			return err
		}
		opts = append(opts, withRedriveOf(j.Of))
	}
	if j.Type != "" {
		opts = append(opts, WithType(j.Type))
	}
	if _, err := c.Submit(ctx, j.Key, j.Payload, opts...); err != nil && !errors.Is(err, ErrDuplicate) {
		return err
	}
	return nil
}
