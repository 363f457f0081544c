package wire

import (
	"strconv"
	"strings"
)

// Dead says why and where a job was dead-lettered.
type Dead struct {
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

// DeadHeader returns the headers of a dead letter: the job's fields that
// Rules.Parse accepted (its ID in Nats-Msg-Id, key, type), the received
// headers that ValidateUserHeader allows (none when received is nil), and
// d. It never copies a received Nats-* or Keylane-* header: those made
// the dead-letter stream refuse the dead letter for ever (a delayed job's
// Nats-Scheduler, an atomic batch's Nats-Batch-*), or would make the
// server act on it. The result holds only headers the dead-letter stream
// stores.
func DeadHeader(j Job, received map[string][]string, d Dead) map[string][]string {
	h := make(map[string][]string, 8+len(received))
	for k, vs := range received {
		ok := len(vs) > 0
		for _, v := range vs {
			ok = ok && ValidateUserHeader(k, v) == nil
		}
		if ok {
			h[k] = append([]string(nil), vs...)
		}
	}
	if ValidateJobID(j.ID) == nil {
		h[HeaderJobID] = []string{j.ID}
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
