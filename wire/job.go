package wire

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/keylane/keylane/partition"
)

// Rules are what the owner of one partition checks a received job
// against.
type Rules struct {
	// Namespace of the jobs stream.
	Namespace string
	// Partition is the owner's partition, Partitions the stream's N.
	Partition  int
	Partitions int
	// ReplyPrefix is the topology's: a worker replies nowhere else.
	ReplyPrefix string
	// Delays says the namespace takes delayed jobs: only then may a job
	// carry Keylane-Job-Id (see Parse), and DelaysStream names its delays
	// stream, the only stream a due copy may have been sourced from.
	Delays       bool
	DelaysStream string
	// MaxKeyBacklog is the namespace's per-key backlog cap (0: none),
	// which the server enforces by the key's subject: on a capped
	// namespace a batch message carries one job, on its key's subject
	// (see ParseBatch).
	MaxKeyBacklog int64
}

// Job is what Rules.Parse read from a job message. A field is set only
// when it passed its rule: a refused message's Job holds what may still
// be trusted (a reply subject to tell the caller, an ID and key a dead
// letter may name).
type Job struct {
	// ID is the job ID: Nats-Msg-Id, or for a delayed job stored when due
	// (which the server strips of Nats-Msg-Id) Keylane-Job-Id; empty when
	// the message carries neither.
	ID string
	// Key is the resource key; set only when the key is the one the
	// message was routed by (its subject's) and belongs to the partition.
	Key   string
	Type  string
	Reply string
	// Idempotent and KeepOutcome are the Keylane-Idempotent and
	// Keylane-Keep-Outcome flags.
	Idempotent  bool
	KeepOutcome bool
	// DueSeq is, for a delayed job's due copy, its sequence in the delays
	// stream (from Nats-Stream-Source): the copy left there once the jobs
	// stream has sourced it, which the worker deletes.
	DueSeq uint64
}

// Parse reads and checks a received job message of subject and header h.
// It returns the fields that passed their rules, and the first refusal in
// this order, as a reason for the dead letter (nil for a valid job):
// a server header no job carries (Nats-Rollup: a submitter purged the
// key's queued jobs; Nats-Schedule: a schedule, not a job), the key, the
// subject (the key's own, in this partition), the partition count the
// client routed with, the reply subject, the job ID, the type. A header
// of those given more than once is refused too: the server and the
// worker might read different ones.
func (r Rules) Parse(subject string, h map[string][]string) (Job, error) {
	return r.parse(subject, h, false)
}

// parse is Parse, or for a delayed job's submission (submission: on
// partition's DelaySubject, see ParseDelayed) the same rules with the
// subject the job ID's instead of the key's.
func (r Rules) parse(subject string, h map[string][]string, submission bool) (Job, error) {
	var j Job
	var first error
	refuse := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, name := range []string{headerRollup, headerSchedule} {
		if _, ok := h[name]; ok {
			refuse(fmt.Errorf("carries %s, which keylane clients never send (the server acts on it when it stores the message)", name))
		}
	}
	get := func(name string) (string, bool) {
		vs := h[name]
		switch len(vs) {
		case 0:
			return "", true
		case 1:
			return vs[0], true
		}
		refuse(fmt.Errorf("%s header given %d times", name, len(vs)))
		return "", false
	}

	if key, ok := get(HeaderKey); ok {
		token := partition.KeyToken(key)
		switch err := ValidateKey(key); {
		case err != nil:
			refuse(fmt.Errorf("bad %s header: %w", HeaderKey, err))
		case !submission && !strings.HasSuffix(subject, "."+token):
			// Not the key's own subject: it would bypass the key's backlog
			// cap. A key sent with white space at either end arrives
			// trimmed by nats.go and lands here, never as another key.
			refuse(fmt.Errorf("subject %q is not key %q's (token %s): the key was published on another key's subject or changed on the way", subject, key, token))
		case r.Partitions > 0 && partition.Of(key, r.Partitions) != r.Partition:
			refuse(fmt.Errorf("key %q belongs to partition %d, arrived on %d", key, partition.Of(key, r.Partitions), r.Partition))
		default:
			j.Key = key
		}
	}
	if n, ok := get(HeaderPartitions); ok && n != "" && n != strconv.Itoa(r.Partitions) {
		refuse(fmt.Errorf("routed by a client that counts %s partitions, the jobs stream has %d: re-open the client", clip(n), r.Partitions))
	}
	if reply, ok := get(HeaderReply); ok && reply != "" {
		if err := ValidateReply(reply, r.ReplyPrefix); err != nil {
			refuse(fmt.Errorf("bad %s header: %w", HeaderReply, err))
		} else {
			j.Reply = reply
		}
	}
	id, okID := get(HeaderJobID)
	delayed, okDelayed := get(HeaderDelayedID)
	switch {
	case !okID || !okDelayed:
	case submission && delayed != "":
		refuse(fmt.Errorf("carries %s on a delayed job's submission (its ID goes in %s)", HeaderDelayedID, HeaderJobID))
	case submission && id == "":
		refuse(fmt.Errorf("a delayed job's submission carries no %s (a delayed job needs its ID)", HeaderJobID))
	case id != "":
		if err := ValidateJobID(id); err != nil {
			refuse(fmt.Errorf("bad %s header: %w", HeaderJobID, err))
		} else {
			j.ID = id
		}
	case delayed != "":
		// Only a delayed job's due copy carries its ID this way (the
		// server strips Nats-Msg-Id when a schedule fires): made by a
		// worker's schedule in the delays stream, named in Nats-Scheduler,
		// and sourced from there by the jobs stream, which the server
		// marks with Nats-Stream-Source and refuses from any publisher.
		// Taken from anyone else it would let a publisher run a job under
		// another job's ID and have its outcome kept there, answering that
		// job's retries and redeliveries.
		scheduler, _ := get(headerScheduler)
		source, _ := get(headerStreamSource)
		from, seq := sourcedFrom(source)
		switch err := ValidateJobID(delayed); {
		case err != nil:
			refuse(fmt.Errorf("bad %s header: %w", HeaderDelayedID, err))
		case !r.Delays:
			refuse(fmt.Errorf("carries %s on a namespace without delays (only a delayed job's due copy carries it)", HeaderDelayedID))
		case scheduler != partition.ScheduleSubject(r.Namespace, r.Partition, delayed):
			refuse(fmt.Errorf("carries %s %q but was not made by that job's schedule (%s %q)", HeaderDelayedID, delayed, headerScheduler, clip(scheduler)))
		case from == "" || from != r.DelaysStream:
			refuse(fmt.Errorf("carries %s %q but was not sourced from the delays stream %s (%s %q)", HeaderDelayedID, delayed, r.DelaysStream, headerStreamSource, clip(source)))
		default:
			j.ID, j.DueSeq = delayed, seq
		}
	}
	if _, ok := h[HeaderRunAt]; ok && !submission {
		refuse(fmt.Errorf("carries %s on a key's subject (a delayed job is submitted on its partition's delay subject)", HeaderRunAt))
	}
	if typ, ok := get(HeaderType); ok {
		if err := ValidateType(typ); err != nil {
			refuse(fmt.Errorf("bad %s header: %w", HeaderType, err))
		} else {
			j.Type = typ
		}
	}
	j.Idempotent = flag(h, HeaderIdempotent)
	j.KeepOutcome = flag(h, HeaderKeepOutcome)
	return j, first
}

// sourcedFrom reads Nats-Stream-Source, which the server sets on a
// message a stream sourced ("<stream> <seq> <filter> <transform> <subject>
// …"): the source stream and the message's sequence there; "" when there
// is none or it is unreadable.
func sourcedFrom(v string) (string, uint64) {
	f := strings.Fields(v)
	if len(f) < 2 {
		return "", 0
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || seq == 0 {
		return "", 0
	}
	return f[0], seq
}

func flag(h map[string][]string, name string) bool {
	vs := h[name]
	return len(vs) > 0 && vs[0] != ""
}
