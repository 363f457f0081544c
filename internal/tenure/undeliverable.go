package tenure

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Undeliverable jobs. nats.go's pull consumer takes a message with an
// empty payload and a Status header for a status from the server (a
// heartbeat, "no messages", a timed-out pull) and never hands it over.
// Stored on a job subject by a raw publisher, such a message is delivered
// and swallowed, the next delivery shows a gap, the partition
// re-synchronises, and the same message is delivered and swallowed
// again: a stall for good (with some Status values the pull ends with an
// error instead of a gap, and the same happens). A keylane client refuses
// such headers (package wire), so only a raw publisher sends one. Before
// each re-synchronisation the owner looks through the partition's stored
// jobs where the swallowed message must be (before the delivery that
// showed a gap, or just after the newest delivery), with the stream
// leader's get (not a direct get), and dead-letters and deletes each that
// nats.go would swallow, so the re-synchronised consumer gets past it.
// Such a message that is the partition's last job leaves no gap to see:
// the fetch loop, idle, asks the server what it delivered
// (unseenDeliveries in fetch.go) and treats deliveries it never received
// as a gap.

// undeliverableScan bounds the stored jobs read behind one gap, and
// undeliverableAhead those read after the newest delivery when a pull
// ended without a gap (an error, missed heartbeats, a reconnect).
const (
	undeliverableScan  = 1024
	undeliverableAhead = 16
)

// statusLike reports whether nats.go's pull consumer takes a message of
// this payload and headers for a status message (its checkMsg).
func statusLike(data []byte, h nats.Header) bool {
	return len(data) == 0 && h.Get("Status") != ""
}

// deadSource is what a dead letter is made from: a delivered job, or a
// stored message read from the stream.
type deadSource interface {
	Subject() string
	Headers() nats.Header
	Data() []byte
}

// rawSource is a stored message read from the stream as a deadSource.
type rawSource struct{ m *jetstream.RawStreamMsg }

func (r rawSource) Subject() string      { return r.m.Subject }
func (r rawSource) Headers() nats.Header { return r.m.Header }
func (r rawSource) Data() []byte         { return r.m.Data }

// errStatusLike is the reason such a message is dead-lettered with.
var errStatusLike = errors.New("an empty payload with a Status header, which nats.go's consumer takes for a server status and never delivers")

// removeSwallowed is the cheap way past a gap: it reports whether the
// partition's stored jobs from stream sequence from to to are exactly
// missing messages that nats.go swallows as a status, and if so
// dead-letters and deletes them all. The delivery that showed the gap must
// be a first delivery: first deliveries come in stream order, so every
// job stored before it and not yet delivered was delivered just before
// it, and if those are exactly the missing deliveries and each is one
// nats.go never hands over, no job was lost. Anything else (a job of
// another kind in the range, more or fewer than missing, a read or write
// that fails) reports false and the partition re-synchronises as for any
// gap.
func (o *Owner) removeSwallowed(from, to, missing uint64) bool {
	if missing > undeliverableAhead {
		return false
	}
	stream := o.topo.Streams[namespace.ShardOf(o.p, len(o.topo.Streams))]
	filter := o.partitionFilter()
	var found []*jetstream.RawStreamMsg
	for seq := from; seq <= to; {
		ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && m.Sequence > to {
			break
		}
		if err != nil || !statusLike(m.Data, m.Header) || uint64(len(found)) == missing {
			return false
		}
		found = append(found, m)
		seq = m.Sequence + 1
	}
	if uint64(len(found)) != missing {
		return false
	}
	for _, m := range found {
		if !o.removeUndeliverable(stream, m) {
			return false
		}
	}
	return true
}

// clearUndeliverable reads the partition's stored jobs from stream
// sequence from to to (at most most of them) and
// dead-letters and deletes each that nats.go would swallow. It returns
// how many it removed; it stops at the first failure (the next gap tries
// again) and when the tenure ends.
func (o *Owner) clearUndeliverable(from, to uint64, most int) int {
	stream := o.topo.Streams[namespace.ShardOf(o.p, len(o.topo.Streams))]
	filter := o.partitionFilter()
	removed := 0
	for seq, n := max(from, 1), 0; seq <= to && n < most; n++ {
		if !o.l.Trusted() || o.ctx.Err() != nil {
			return removed
		}
		ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return removed // nothing more of the partition stored
		}
		if err != nil {
			o.log.Warn("looking for an undeliverable job after a gap", "seq", seq, "err", natserr.Once(err))
			return removed
		}
		if m.Sequence > to {
			return removed
		}
		seq = m.Sequence + 1
		if !statusLike(m.Data, m.Header) {
			continue
		}
		if !o.removeUndeliverable(stream, m) {
			return removed
		}
		removed++
	}
	return removed
}

// removeUndeliverable dead-letters m, a stored job nats.go swallows, with
// the reason, and deletes it from the jobs stream; it reports whether
// both were done.
func (o *Owner) removeUndeliverable(stream jetstream.Stream, m *jetstream.RawStreamMsg) bool {
	f, _ := o.rules().Parse(m.Subject, m.Header)
	o.stats.Malformed.Add(1)
	why := core.Permanent(fmt.Errorf("malformed: %w", errStatusLike))
	o.log.Warn("undeliverable message dead-lettered", "seq", m.Sequence, "err", why)
	if !o.deadLetter(rawSource{m}, core.Job{ID: f.ID, Key: f.Key, Seq: m.Sequence, Partition: o.p, Fence: o.l.Fence()}, why, 0) || !o.l.Trusted() {
		return false
	}
	ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
	err := stream.DeleteMsg(ctx, m.Sequence)
	cancel()
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		// Dead-lettered but still stored: the next gap dead-letters it
		// again (a second dead letter, never a lost job).
		o.log.Error("delete of a dead-lettered undeliverable message", "seq", m.Sequence, "err", natserr.Once(err))
		return false
	}
	return true
}

// partitionFilter matches every message the partition's consumer
// delivers: its keys' subjects, and with delays its delay subject too
// (ns.*.<p>.* then: the jobs stream has no other subjects of p).
func (o *Owner) partitionFilter() string {
	if o.topo.Meta.Delays {
		return o.topo.Names.Namespace + ".*." + strconv.Itoa(o.p) + ".*"
	}
	return partition.Filter(o.topo.Names.Namespace, o.p)
}
