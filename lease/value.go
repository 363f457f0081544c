package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go/jetstream"
)

// Info is what a lease entry says about its holder.
type Info struct {
	// Holder is Config.Holder of the lease.
	Holder string `json:"holder"`
	// Nonce is random per tenure: it tells the holder's own writes apart
	// from anyone else's, including an earlier tenure of the same holder.
	Nonce string `json:"nonce"`
	// AcquiredAt is the holder's wall clock when it sent the Create. For
	// humans only: the protocol never compares clocks across processes.
	AcquiredAt time.Time `json:"acquired_at"`
	// Fence is the tenure's fencing token (Lease.Fence): the revision of
	// the Create. The Create cannot name its own revision, so its value
	// has none and its renews carry it; Read fills it in either way.
	Fence uint64 `json:"fence,omitempty"`
	// Host and Version are Config.Host and Config.Version: where the
	// holder runs and what build it is. For humans only (the console's
	// worker list); empty when not given.
	Host    string `json:"host,omitempty"`
	Version string `json:"version,omitempty"`
}

// Decode parses a lease entry's value.
func Decode(value []byte) (Info, error) {
	var info Info
	if err := json.Unmarshal(value, &info); err != nil {
		return Info{}, fmt.Errorf("lease: decode value: %w", err)
	}
	if info.Holder == "" || info.Nonce == "" {
		return Info{}, fmt.Errorf("lease: decode value: missing holder or nonce in %q", value)
	}
	return info, nil
}

func (info Info) encode() ([]byte, error) {
	b, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("lease: encode value: %w", err)
	}
	return b, nil
}

func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Read returns the current holder of key, with its tenure's fence (the
// revision of the Create, which renews do not change), and the entry's
// revision (which each renew moves). A free key (never taken, deleted,
// purged or expired) returns ErrFree. An entry without a fence is the
// Create itself (or a renew by a holder that predates the field): its
// revision stands in.
func Read(ctx context.Context, kv jetstream.KeyValue, key string) (Info, uint64, error) {
	info, rev, _, err := ReadWritten(ctx, kv, key)
	return info, rev, err
}

// ReadWritten is Read, and also when the server stored the entry's last
// write (the holder's last renew, by the server's clock): see Lapsed.
func ReadWritten(ctx context.Context, kv jetstream.KeyValue, key string) (Info, uint64, time.Time, error) {
	kv = natserr.KeyValue(kv) // errors say "nats:" once
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Info{}, 0, time.Time{}, fmt.Errorf("%w: key %q", ErrFree, key)
	}
	if err != nil {
		return Info{}, 0, time.Time{}, fmt.Errorf("lease: read %q: %w", key, err)
	}
	info, err := Decode(e.Value())
	if err != nil {
		return Info{}, e.Revision(), e.Created(), fmt.Errorf("lease: read %q at revision %d: %w", key, e.Revision(), err)
	}
	if info.Fence == 0 {
		info.Fence = e.Revision()
	}
	return info, e.Revision(), e.Created(), nil
}

// Lapsed reports whether the holder of a lease entry has missed its
// renews (its heartbeat): the entry was last written at written, the
// server's timestamp of the write (jetstream.KeyValueEntry.Created), and
// now, the server's clock too (jetstream.StreamInfo.TimeStamp, so that
// no clock of the reader's enters), is more than two thirds of the
// bucket's TTL later. A holder renews every RenewEvery (TTL/3 by
// default): a lapsed entry has missed a renew by a whole period more, and
// its holder has at most TTL/3 - SafetyMargin left of its trust window.
// A killed holder's entry lapses one to two renew periods after the
// kill, where the server removes it only a TTL after its last write. The
// entry still blocks a Create until then: lapsed is a reader's verdict
// (the holder is not known to be alive), not a free key.
func Lapsed(written, now time.Time, ttl time.Duration) bool {
	return now.Sub(written) > LapseAfter(ttl)
}

// LapseAfter is the age past which an entry of a bucket of lease TTL ttl
// is Lapsed: two thirds of ttl.
func LapseAfter(ttl time.Duration) time.Duration { return ttl * 2 / 3 }
