package keylane

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
)

// nuidDigits is a nuid's alphabet, most significant digit first.
const nuidDigits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// nuidSeq reads the sequence of a nuid (its last 10 digits, base 62).
func nuidSeq(id string) (prefix string, seq uint64, ok bool) {
	if len(id) != 22 {
		return "", 0, false
	}
	for i := 12; i < 22; i++ {
		d := strings.IndexByte(nuidDigits, id[i])
		if d < 0 {
			return "", 0, false
		}
		seq = seq*62 + uint64(d)
	}
	return id[:12], seq, true
}

func nuidOf(prefix string, seq uint64) string {
	var b [10]byte
	for i := 9; i >= 0; i-- {
		b[i] = nuidDigits[seq%62]
		seq /= 62
	}
	return prefix + string(b[:])
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// TestPredictedBatchIDsLoseNoJobs: another client reads the IDs of an
// honest client's Calls from the results stream by sequence, works out
// the IDs it will draw next (a nuid is a fixed prefix and a counter with
// a fixed step) and stores messages under them first. The honest
// SubmitMany's batch must not be dropped as a duplicate of those while
// every job of it reports stored. Before, batch IDs were nuids and a
// duplicate answer to a batch counted as stored: every job said stored,
// none ran.
func TestPredictedBatchIDsLoseNoJobs(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := batchWorker(e, "w1", newCounter())
	e.waitOwned(w)
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 6 {
		if _, err := c.Call(ctx(t), "seat:seen", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Stop(sctx); err != nil {
		t.Fatal(err)
	}

	// The attacker: the kept outcomes' keys, in stream order.
	results := e.topo.Names.Results()
	bySeq := map[string][]uint64{}
	for _, m := range natstest.StreamMsgs(t, e.js, "KV_"+results) {
		if prefix, seq, ok := nuidSeq(strings.TrimPrefix(m.Subject, "$KV."+results+".")); ok {
			bySeq[prefix] = append(bySeq[prefix], seq)
		}
	}
	predicted := 0
	for prefix, seqs := range bySeq {
		if len(seqs) < 3 {
			continue
		}
		var step uint64
		for i := 1; i < len(seqs); i++ {
			step = gcd(step, seqs[i]-seqs[i-1])
		}
		last := seqs[len(seqs)-1]
		for k := uint64(1); k <= 200; k++ {
			m := nats.NewMsg(partition.Subject(e.ns, 0, "junk"))
			m.Header.Set(HeaderKey, "junk")
			m.Header.Set(HeaderJobID, nuidOf(prefix, last+k*step))
			if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
				t.Fatal(err)
			}
			predicted++
		}
	}
	t.Logf("%d IDs predicted and taken", predicted)

	reqs := make([]Request, 8)
	for i := range reqs {
		reqs[i] = Request{Key: "seat:victim", Payload: []byte(fmt.Sprint(i))}
	}
	out, err := c.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, o := range out {
		if o.Err == nil {
			stored++
		}
	}
	batchWorker(e, "w2", newCounter())
	want := fmt.Sprint(stored)
	if stored == 0 {
		want = ""
	}
	testwait.Eventually(t, 20*time.Second, "every stored job run", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	if got := e.stateOf("seat:victim"); got != want {
		t.Fatalf("%d jobs reported stored, yet the key's state is %q after every stored job ran: lost", stored, got)
	}
	if stored != len(reqs) {
		t.Fatalf("%d of %d jobs stored: %v", stored, len(reqs), out)
	}
}

// TestBatchUnderAUsedIDIsNotStored: a batch whose ID the stream already
// holds on its first publish (someone stored a message under it first:
// no earlier copy of ours can exist) was not stored, and its jobs must
// say so. Before, SubmitMany counted the duplicate answer as stored.
func TestBatchUnderAUsedIDIsNotStored(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	e.waitOwned(batchWorker(e, "w", newCounter()))
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var taken atomic.Int32
	c.e.SetBeforeBatch(func(m *nats.Msg) {
		first := nats.NewMsg(partition.Subject(e.ns, 0, "junk"))
		first.Header.Set(HeaderKey, "junk")
		first.Header.Set(HeaderJobID, m.Header.Get(HeaderJobID))
		if _, err := e.js.PublishMsg(context.Background(), first); err != nil {
			t.Error(err)
		}
		taken.Add(1)
	})
	reqs := make([]Request, 8)
	for i := range reqs {
		reqs[i] = Request{Key: "seat:victim", Payload: []byte(fmt.Sprint(i))}
	}
	out, err := c.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if taken.Load() == 0 {
		t.Fatal("no batch message was sent: the test proved nothing")
	}
	for _, o := range out {
		if o.Err == nil || !strings.Contains(o.Err.Error(), "batch ID already used") {
			t.Fatalf("job %s of a batch the stream dropped: %v; want \"batch ID already used: not stored\"", o.ID, o.Err)
		}
	}
}

// TestLoneJobUnderAUsedIDIsNotStored: SubmitMany's jobs that go alone (on
// a capped namespace, each a batch of one on its key's subject) whose
// batch ID another message holds are reported not stored: the stream
// answered "duplicate" to the first copy and kept the other message.
// Before, SubmitMany dropped that ack's duplicate flag and reported them
// stored (Submit and batches of several already said errBatchIDUsed).
func TestLoneJobUnderAUsedIDIsNotStored(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, MaxKeyBacklog: 100})
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var taken atomic.Int32
	c.e.SetBeforeAlone(func(m *nats.Msg) {
		first := nats.NewMsg(partition.Subject(e.ns, 0, "junk"))
		first.Header.Set(nats.MsgIdHdr, m.Header.Get(nats.MsgIdHdr))
		if _, err := e.js.PublishMsg(context.Background(), first); err != nil {
			t.Error(err)
		}
		taken.Add(1)
	})
	reqs := make([]Request, 3)
	for i := range reqs {
		reqs[i] = Request{Key: "seat:victim", Payload: []byte(fmt.Sprint(i)), ID: fmt.Sprintf("order-%d", i)}
	}
	out, err := c.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if taken.Load() != int32(len(reqs)) {
		t.Fatalf("%d lone batches seen, want %d: the test proved nothing", taken.Load(), len(reqs))
	}
	for _, o := range out {
		if o.Err == nil || !strings.Contains(o.Err.Error(), "batch ID already used") {
			t.Fatalf("job %s whose batch of one the stream dropped: %v; want \"batch ID already used: not stored\"", o.ID, o.Err)
		}
	}
}
