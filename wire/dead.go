package wire

import (
	"strconv"
	"strings"
)

// Dead says why and where a job was dead-lettered.
type Dead struct {
	// ID is the dead letter's own ID (its Nats-Msg-Id, see DeadID), so a
	// job dead-lettered twice (a worker died before its ack) is stored
	// once; empty for none.
	ID string
	// Error is why; DeadHeader cuts it to DeadErrorMax bytes.
	Error     string
	Attempts  int
	Worker    string
	Seq       uint64 // the job's sequence in the jobs stream
	Partition int
	Fence     uint64
	// PayloadDropped, when positive, is the length of a payload left out
	// to fit max_payload.
	PayloadDropped int
}

// DeadErrorMax bounds a dead letter's error text, in bytes.
const DeadErrorMax = 1024

// DeadID is the ID of the dead letter of the job stored at seq in the
// jobs stream of epoch: unique per stored job across every jobs stream
// the namespace had. A dead letter's Nats-Msg-Id never is the job's ID:
// the dead-letter stream de-duplicates by it, and a publisher that put a
// victim's ID on a malformed message would have its dead letter taken for
// the victim's, whose dead letter was then dropped as a duplicate and
// its job acked as stored.
func DeadID(epoch, seq uint64) string {
	if seq == 0 {
		return ""
	}
	return deadIDPrefix + strconv.FormatUint(epoch, 16) + "-" + strconv.FormatUint(seq, 10)
}

const deadIDPrefix = "dl-"

// JobIDOfDead returns the job ID a dead letter of headers h names:
// Keylane-Job-Id, or for a dead letter of an earlier release, which
// carried it in Nats-Msg-Id, that (unless it is a DeadID).
func JobIDOfDead(h map[string][]string) string {
	if vs := h[HeaderDelayedID]; len(vs) > 0 && vs[0] != "" {
		return vs[0]
	}
	vs := h[HeaderJobID]
	if len(vs) == 0 || isDeadID(vs[0]) {
		return ""
	}
	return vs[0]
}

func isDeadID(s string) bool {
	rest, ok := strings.CutPrefix(s, deadIDPrefix)
	epoch, seq, ok2 := strings.Cut(rest, "-")
	if !ok || !ok2 {
		return false
	}
	seq, index, inBatch := strings.Cut(seq, "-") // BatchDeadID's
	_, err1 := strconv.ParseUint(epoch, 16, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	_, err3 := strconv.ParseUint(index, 10, 32)
	return err1 == nil && err2 == nil && (!inBatch || err3 == nil)
}

// DeadHeader returns the headers of a dead letter: its own ID (d.ID, in
// Nats-Msg-Id), the job's fields that Rules.Parse accepted (its ID in
// Keylane-Job-Id, key, type), the received
// headers that ValidateUserHeader allows (none when received is nil), and
// d. It never copies a received Nats-* or Keylane-* header: those made
// the dead-letter stream refuse the dead letter for ever (a delayed job's
// Nats-Scheduler, an atomic batch's Nats-Batch-*), or would make the
// server act on it. The result holds only headers the dead-letter stream
// stores.
func DeadHeader(j Job, received map[string][]string, d Dead) map[string][]string {
	h := make(map[string][]string, 8+len(received))
	copyUserHeaders(h, received)
	if d.ID != "" {
		h[HeaderJobID] = []string{d.ID}
	}
	if ValidateJobID(j.ID) == nil {
		h[HeaderDelayedID] = []string{j.ID}
	}
	if j.Key != "" && ValidateKey(j.Key) == nil {
		h[HeaderKey] = []string{j.Key}
	}
	if j.Type != "" && ValidateType(j.Type) == nil {
		h[HeaderType] = []string{j.Type}
	}
	h[HeaderError] = []string{DeadErrorText(d.Error)}
	h[HeaderAttempts] = []string{strconv.Itoa(d.Attempts)}
	if w := strings.ToValidUTF8(d.Worker, ""); w != "" && validHeaderValue(w) {
		h[HeaderWorker] = []string{w}
	}
	h[HeaderSeq] = []string{strconv.FormatUint(d.Seq, 10)}
	h[HeaderPartition] = []string{strconv.Itoa(d.Partition)}
	h[HeaderFence] = []string{strconv.FormatUint(d.Fence, 10)}
	if d.PayloadDropped > 0 {
		h[HeaderPayloadDropped] = []string{strconv.Itoa(d.PayloadDropped)}
	}
	return h
}

// DeadErrorText is s as a dead letter's error header: valid UTF-8, at
// most DeadErrorMax bytes (then "…" after), control characters as
// spaces, never empty, nothing at either end that a header loses.
func DeadErrorText(s string) string {
	s = strings.ToValidUTF8(s, "")
	cut := len(s) > DeadErrorMax
	if cut {
		s = strings.ToValidUTF8(s[:DeadErrorMax], "")
	}
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	s = strings.Trim(s, " ")
	if s == "" {
		s = "(no error text)"
	}
	if cut {
		s += "…"
	}
	return s
}

// copyUserHeaders copies into h the received headers ValidateUserHeader
// allows, every value of each; a name with one value it refuses is left
// out whole.
func copyUserHeaders(h, received map[string][]string) {
	for k, vs := range received {
		ok := len(vs) > 0
		for _, v := range vs {
			ok = ok && ValidateUserHeader(k, v) == nil
		}
		if ok {
			h[k] = append([]string(nil), vs...)
		}
	}
}
