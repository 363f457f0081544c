package client

import (
	"crypto/rand"

	"github.com/keylane/keylane/wire"
)

// IDs the client generates: a batch's ID (SealBatch) and a job's when its
// caller gives none. Both were nuids, a fixed prefix and a counter with a
// fixed step: from two IDs another client read, it worked out the next
// ones and stored messages under them first, so the server dropped the
// honest batch (or job) as a duplicate (TestPredictedBatchIDsLoseNoJobs).
// Now each is wire.BatchIDLen letters and digits from crypto/rand, the
// shape wire.ValidBatchID keeps: about 131 bits, none derived from
// another.

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns wire.BatchIDLen characters of [A-Za-z0-9] drawn
// uniformly from crypto/rand (bytes of 248 and over are drawn again: 248
// is 4×62, so no character is likelier than another).
func NewID() string {
	var out [wire.BatchIDLen]byte
	var buf [wire.BatchIDLen + 8]byte
	n := 0
	for n < len(out) {
		_, _ = rand.Read(buf[:]) // never fails (crypto/rand since Go 1.24)
		for _, c := range buf {
			if c >= 248 {
				continue
			}
			out[n] = idAlphabet[c%62]
			if n++; n == len(out) {
				break
			}
		}
	}
	return string(out[:])
}
