// Package partition maps resource keys onto the partitions of the keylane
// jobs stream, names the subjects that carry them (one per key inside its
// partition's: ns.jobs.<p>.<KeyToken(key)>), and assigns the
// partitions to workers (Assign: even, sticky, by rendezvous hash).
//
// The mapping is xxhash64(key) mod N. It is the only hash keylane ever uses:
// the server's own partition() subject transform uses FNV-1a, so keylane never
// asks the server to partition. N is fixed when the stream is created and is
// recorded, together with HashName, in the stream's metadata.
//
// All functions are pure and safe for concurrent use.
package partition

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// HashName names the key hash. It is written into the stream metadata so that
// a client built with another hash refuses to talk to the stream.
const HashName = "xxhash64-mod"

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 1024

// MaxPartitions bounds N. More partitions than this would only cost consumers.
const MaxPartitions = 4096

var (
	// ErrEmptyKey is returned for an empty resource key.
	ErrEmptyKey = errors.New("partition: key is empty")
	// ErrKeyTooLong is returned for a key longer than MaxKeyLen bytes.
	ErrKeyTooLong = errors.New("partition: key longer than 1024 bytes")
	// ErrKeyNotUTF8 is returned for a key that is not valid UTF-8.
	ErrKeyNotUTF8 = errors.New("partition: key is not valid UTF-8")
	// ErrKeyControl is returned for a key holding a control character.
	ErrKeyControl = errors.New("partition: key contains a control character")
	// ErrKeySpace is returned for a key that starts or ends with white
	// space, which header values lose on the way.
	ErrKeySpace = errors.New("partition: key starts or ends with white space")
	// ErrBadCount is returned for a partition count outside 1..MaxPartitions.
	ErrBadCount = errors.New("partition: count must be between 1 and 4096")
)

// ValidateKey reports why key cannot be used as a resource key, or nil.
// Keys travel in a message header, never in a subject, so any UTF-8 text up
// to MaxKeyLen bytes is safe there, with two exceptions: a control
// character (CR, LF, TAB, NUL, DEL, …) would corrupt or be rewritten in the
// header line, and white space at either end is trimmed from header values
// on the way (nats.go trims the value it sends), so the worker would read
// another key than the subject was routed by. Both are refused
// (ErrKeyControl, ErrKeySpace); white space inside a key is fine.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return ErrEmptyKey
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w (%d bytes)", ErrKeyTooLong, len(key))
	case !utf8.ValidString(key):
		return ErrKeyNotUTF8
	}
	for i, r := range key {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w at byte %d", ErrKeyControl, i)
		}
	}
	first, _ := utf8.DecodeRuneInString(key)
	last, _ := utf8.DecodeLastRuneInString(key)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Errorf("%w (got %q)", ErrKeySpace, key)
	}
	return nil
}

// ValidateCount reports whether n is a usable partition count.
func ValidateCount(n int) error {
	if n < 1 || n > MaxPartitions {
		return fmt.Errorf("%w (got %d)", ErrBadCount, n)
	}
	return nil
}

// Of returns the partition of key among n partitions, in [0, n).
// It panics only if n < 1; callers validate n with ValidateCount first.
func Of(key string, n int) int {
	return int(xxhash.Sum64String(key) % uint64(n))
}

// KeyToken returns the subject token of key: its xxhash64 as 16 lowercase
// hex digits. A key's jobs travel on their own subject inside their
// partition's, so the server counts each key's stored jobs and can cap
// them (MaxMsgsPerSubject). The key itself stays in a header: any UTF-8
// text is safe there, and no subject grows with the key. Two keys with one
// hash (about one pair in 2^64) share a subject, and so a backlog cap;
// they never share order or state, which follow the key header.
func KeyToken(key string) string {
	var b [16]byte
	h := xxhash.Sum64String(key)
	const digits = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		b[i] = digits[h&0xf]
		h >>= 4
	}
	return string(b[:])
}

// Filter returns the subject filter of partition p's jobs, every key's,
// e.g. "keylane.jobs.3.*": the jobs stream's subject for p and the filter
// of p's consumer.
func Filter(namespace string, p int) string {
	return namespace + ".jobs." + strconv.Itoa(p) + ".*"
}

// Subject returns the subject that carries the jobs of key in partition
// p, e.g. "keylane.jobs.3.9f1c6a08d2b7e415" (see KeyToken).
func Subject(namespace string, p int, key string) string {
	return namespace + ".jobs." + strconv.Itoa(p) + "." + KeyToken(key)
}

// DelayFilter returns the subject filter of partition p's delayed jobs
// as clients submit them, e.g. "keylane.delay.3.*": a plain message in
// the jobs stream, which the partition's owner moves into the delays
// stream (ScheduleSubject).
func DelayFilter(namespace string, p int) string {
	return namespace + ".delay." + strconv.Itoa(p) + ".*"
}

// DelaySubject returns the subject a client submits delayed job ID id of
// partition p to, e.g. "keylane.delay.3.order~17" (its dots become '~',
// which IDs never hold).
func DelaySubject(namespace string, p int, id string) string {
	return namespace + ".delay." + strconv.Itoa(p) + "." + idToken(id)
}

// ScheduleSubject returns the subject, in the delays stream, of the
// schedule that stores delayed job ID id of partition p when it is due,
// e.g. "keylane.sched.3.order~17". The server keeps one schedule per
// subject, so the ID names it. Only workers publish there.
func ScheduleSubject(namespace string, p int, id string) string {
	return namespace + ".sched." + strconv.Itoa(p) + "." + idToken(id)
}

// DueFilter returns the subject filter, in the delays stream, of
// partition p's delayed jobs stored when due, e.g. "keylane.due.3.*"; the
// jobs stream sources them onto their keys' subjects (Filter).
func DueFilter(namespace string, p int) string {
	return namespace + ".due." + strconv.Itoa(p) + ".*"
}

// DueSubject returns the subject a delayed job of key in partition p is
// stored on when due, in the delays stream, e.g.
// "keylane.due.3.9f1c6a08d2b7e415".
func DueSubject(namespace string, p int, key string) string {
	return namespace + ".due." + strconv.Itoa(p) + "." + KeyToken(key)
}

func idToken(id string) string { return strings.ReplaceAll(id, ".", "~") }

// SubjectWildcard returns the subject filter that matches every job.
func SubjectWildcard(namespace string) string { return namespace + ".jobs.*.*" }

// DeadSubject returns the dead-letter subject of partition p.
func DeadSubject(namespace string, p int) string {
	return namespace + ".dead." + strconv.Itoa(p)
}

// DeadWildcard returns the subject filter that matches every dead-letter subject.
func DeadWildcard(namespace string) string { return namespace + ".dead.*" }

// FromSubject parses the partition number and the key token out of a jobs
// subject made by Subject. It returns an error for any other subject.
func FromSubject(namespace, subject string) (p int, token string, err error) {
	prefix := namespace + ".jobs."
	rest, ok := strings.CutPrefix(subject, prefix)
	num, token, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return 0, "", fmt.Errorf("partition: subject %q is not a jobs subject of %q", subject, namespace)
	}
	p, err = strconv.Atoi(num)
	if err != nil || p < 0 || strconv.Itoa(p) != num {
		return 0, "", fmt.Errorf("partition: subject %q has no partition number", subject)
	}
	if !validToken(token) {
		return 0, "", fmt.Errorf("partition: subject %q has no key token", subject)
	}
	return p, token, nil
}

func validToken(token string) bool {
	if len(token) != 16 {
		return false
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Owner returns, among members, the one with the highest rendezvous hash for
// partition p, or "" when members is empty. Adding or removing one member of
// M moves only the partitions that member wins or held: about 1/M of them,
// but the split is uneven (four members of 16 partitions may own 3, 2, 6
// and 5); workers are balanced with Assign, which breaks ties the same way.
func Owner(p int, members []string) string {
	var best string
	var bestScore uint64
	for _, m := range members {
		s := score(p, m)
		if best == "" || s > bestScore || (s == bestScore && m > best) {
			best, bestScore = m, s
		}
	}
	return best
}

func score(p int, member string) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(p) >> (8 * i))
	}
	_, _ = d.Write(b[:])
	_, _ = d.WriteString(member)
	return d.Sum64()
}
