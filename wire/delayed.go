package wire

import (
	"fmt"
	"strconv"
	"time"

	"github.com/keylane/keylane/partition"
)

// HeaderRunAt carries, on a delayed job's submission, the time it is due
// (RFC 3339, UTC, nanoseconds). Only a submission on its partition's
// delay subject may carry it; on a key's subject it is refused.
const HeaderRunAt = "Keylane-Run-At"

// MaxDelay bounds how far after it is stored a delayed job may be due:
// 30 days.
const MaxDelay = 30 * 24 * time.Hour

// RunAtSlack is how far beyond MaxDelay from its storing a worker still
// takes a submission's run-at time: the client checked MaxDelay against
// its own clock, and clocks differ a little.
const RunAtSlack = time.Minute

// headerSchedule* are nats-server's message-schedule headers (2.12 and
// later), which only a worker writes, on the delays stream.
const (
	headerSchedulePattern = "Nats-Schedule"
)

// Delayed is a delayed job's submission as ParseDelayed read it.
type Delayed struct {
	Job
	// RunAt is when the job is due.
	RunAt time.Time
}

// ParseDelayed reads and checks a delayed job's submission: a message on
// the partition's DelaySubject, stored at stored. It applies Parse's rules
// with these differences, and returns the first refusal as Parse does:
// the subject is the job ID's (partition.DelaySubject), not the key's;
// the ID is required and travels in Nats-Msg-Id (Keylane-Job-Id is
// refused); Keylane-Reply is refused (a delayed job has no caller
// waiting: Call refuses delays); Keylane-Run-At is required, an RFC 3339
// time at most MaxDelay (plus RunAtSlack) after stored. A run-at in the
// past is valid: the job is due at once.
func (r Rules) ParseDelayed(subject string, h map[string][]string, stored time.Time) (Delayed, error) {
	j, err := r.parse(subject, h, true)
	d := Delayed{Job: j}
	refuse := func(e error) {
		if err == nil {
			err = e
		}
	}
	if !r.Delays {
		refuse(fmt.Errorf("a delayed job's submission on a namespace without delays"))
	}
	if j.ID != "" && subject != partition.DelaySubject(r.Namespace, r.Partition, j.ID) {
		refuse(fmt.Errorf("subject %q is not delayed job %q's of partition %d (%s)", clip(subject), j.ID, r.Partition, partition.DelaySubject(r.Namespace, r.Partition, j.ID)))
	}
	if vs := h[HeaderReply]; len(vs) > 0 {
		refuse(fmt.Errorf("a delayed job's submission carries %s (no caller waits for a delayed job)", HeaderReply))
		d.Reply = ""
	}
	if t, rerr := runAt(h, stored); rerr != nil {
		refuse(rerr)
	} else {
		d.RunAt = t
	}
	if err != nil {
		d.RunAt = time.Time{}
	}
	return d, err
}

// runAt reads a submission's Keylane-Run-At: required, once, an RFC 3339
// time at most MaxDelay (plus RunAtSlack) after stored.
func runAt(h map[string][]string, stored time.Time) (time.Time, error) {
	switch vs := h[HeaderRunAt]; {
	case len(vs) == 0:
		return time.Time{}, fmt.Errorf("a delayed job's submission carries no %s", HeaderRunAt)
	case len(vs) > 1:
		return time.Time{}, fmt.Errorf("%s header given %d times", HeaderRunAt, len(vs))
	default:
		t, perr := time.Parse(time.RFC3339Nano, vs[0])
		switch {
		case perr != nil:
			return time.Time{}, fmt.Errorf("bad %s header %q: want an RFC 3339 time", HeaderRunAt, clip(vs[0]))
		case t.After(stored.Add(MaxDelay + RunAtSlack)):
			return time.Time{}, fmt.Errorf("%s %s is more than %s after the job was stored (%s)", HeaderRunAt, t.UTC().Format(time.RFC3339), MaxDelay, stored.UTC().Format(time.RFC3339))
		}
		return t, nil
	}
}

// ParseDelayedBatch reads and checks a delayed job's submission sent in
// the one message format: a batch of one job (ParseBatch's rules, but on
// its delay subject) with Keylane-Run-At on the message, stored at
// stored. The job must carry no reply (no caller waits for a delayed
// job), the subject must be its ID's DelaySubject of this partition, and
// the run-at follows ParseDelayed's rule. It returns the submission, the
// job's own headers and its payload (what the schedule carries), and the
// first refusal: a message that is no valid batch of one, or the job's.
func (r Rules) ParseDelayedBatch(subject string, h map[string][]string, body []byte, stored time.Time) (Delayed, map[string][]string, []byte, error) {
	if !r.Delays {
		return Delayed{}, nil, nil, fmt.Errorf("a delayed job's submission on a namespace without delays")
	}
	if _, ok := h[HeaderRedriveOf]; ok {
		return Delayed{}, nil, nil, fmt.Errorf("a delayed job's submission carries %s (a redrive is never delayed)", HeaderRedriveOf)
	}
	es, err := r.parseBatch(subject, h, body, false)
	if err != nil {
		return Delayed{}, nil, nil, err
	}
	if len(es) != 1 {
		return Delayed{}, nil, nil, fmt.Errorf("a delayed submission of %d jobs (a delayed job goes alone, a batch of one)", len(es))
	}
	e := es[0]
	d := Delayed{Job: e.Job}
	switch {
	case e.Err != nil:
		return d, nil, nil, e.Err
	case e.Job.Reply != "":
		d.Reply = ""
		return d, nil, nil, fmt.Errorf("a delayed job's submission carries a reply (no caller waits for a delayed job)")
	case subject != partition.DelaySubject(r.Namespace, r.Partition, e.Job.ID):
		return d, nil, nil, fmt.Errorf("subject %q is not delayed job %q's of partition %d (%s)", clip(subject), e.Job.ID, r.Partition, partition.DelaySubject(r.Namespace, r.Partition, e.Job.ID))
	}
	t, err := runAt(h, stored)
	if err != nil {
		return d, nil, nil, err
	}
	d.RunAt = t
	return d, e.Header, e.Payload, nil
}

// Schedule returns the subject and headers of the schedule a worker
// stores in the delays stream for d, a submission ParseDelayed accepted,
// received with headers received; msgID is the schedule's own Nats-Msg-Id
// (MoveID), so a worker that moves the same submission twice stores one
// schedule. When due, the server stores the job on its key's DueSubject
// with these headers, less the schedule's (and Nats-Msg-Id), plus
// Nats-Scheduler naming the schedule; the jobs stream sources it onto the
// key's subject. Like a dead letter it is built from what the rules
// accepted and the allowed user headers, never from received Nats-* or
// Keylane-* headers.
func (r Rules) Schedule(d Delayed, received map[string][]string, msgID string) (string, map[string][]string) {
	h := make(map[string][]string, 10+len(received))
	copyUserHeaders(h, received)
	h[HeaderKey] = []string{d.Key}
	if d.Type != "" {
		h[HeaderType] = []string{d.Type}
	}
	h[HeaderDelayedID] = []string{d.ID}
	// Its outcome is kept by ID: a due copy stored twice (a server
	// stopped between storing it and removing the schedule) is answered
	// from it, not run again.
	h[HeaderIdempotent] = []string{"1"}
	h[HeaderPartitions] = []string{strconv.Itoa(r.Partitions)}
	h[headerSchedulePattern] = []string{"@at " + d.RunAt.UTC().Format(time.RFC3339Nano)}
	h[headerScheduleTarget] = []string{partition.DueSubject(r.Namespace, r.Partition, d.Key)}
	h[HeaderJobID] = []string{msgID}
	return partition.ScheduleSubject(r.Namespace, r.Partition, d.ID), h
}

// moveIDPrefix starts a schedule's own Nats-Msg-Id.
const moveIDPrefix = "mv-"

// MoveID is the Nats-Msg-Id of the schedule made from the submission
// stored at seq in the jobs stream of epoch: "mv-<epoch hex>-<seq>".
func MoveID(epoch, seq uint64) string {
	return moveIDPrefix + strconv.FormatUint(epoch, 16) + "-" + strconv.FormatUint(seq, 10)
}
