package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// TestHostileWire runs a sale on a few hot keys through honest Calls and
// Submits while a hostile publisher, using only what the shipped
// docs/security/accounts.conf lets a client publish (its namespace's job
// and delay subjects, with acks to its inbox), sends crafted messages for
// a bounded time: every Nats-* control header, Keylane-* headers only
// workers set (a redrive of an honest job, a reply elsewhere, a forged
// error), odd and over-long job IDs and keys, white space, huge headers,
// atomic batches of bad jobs, messages nats.go's consumer takes for a
// server status, wrong partitions, tokens and partition
// counts, and delayed jobs' submissions aimed at other keys and
// partitions, or carrying schedule headers. The namespace takes delayed
// jobs, the most a client can reach: its jobs stream still allows
// neither roll-ups nor schedules (the schedules live in the delays
// stream, which clients cannot publish to), so Nats-Rollup and every
// schedule header are among the control headers sent.
//
// Afterwards:
//   - the history checker passes for the honest buyers: every acknowledged
//     job applied exactly once, in order, one run per key at a time, final
//     stock the fold of the acknowledged jobs (no honest outcome changed,
//     no acknowledged job deleted);
//   - every partition kept serving: no honest key went longer than
//     hostileStallBound without an honest op succeeding;
//   - every hostile message was refused at publish or dead-lettered with a
//     reason, and no honest job was dead-lettered.
//
// Each run draws a fresh seed and logs it; KEYLANE_SEED replays the
// messages (not their timing); KEYLANE_HOSTILE sets how long the hostile
// publisher goes on (default hostileDefault).
func TestHostileWire(t *testing.T) { hostileWire(t, "e2e-hostile") }

// hostileWire is TestHostileWire in namespace ns, its workers started with
// the extra flags args. The
// honest load mixes in Calls and Submits without a caller's ID, which
// travel in batch messages, and the hostile publisher sends hostile batch
// messages too (hostilePublisher.sendBatch).
func hostileWire(t *testing.T, ns string, args ...string) {
	if testing.Short() {
		t.Skip("hostile wire: skipped in -short")
	}
	seed, runFor := nemesisRun(t, "hostile wire", "KEYLANE_HOSTILE", hostileDefault)
	rng := rand.New(rand.NewPCG(seed, seed^0x686f7374696c65))

	c := startCluster(t, ns, 2, append([]string{"--delays", "--ack-wait", faultAckWait.String()}, args...)...)
	keys := []string{"hostile:0", "hostile:1", "hostile:2"}
	h := newHistory("honest", func() *keylane.Client { return c.client })
	for _, k := range keys {
		if o := h.call(k, "set 100000"); o.Err != nil || o.Reply != "ok 100000" {
			t.Fatalf("set %s: %v", k, o)
		}
	}

	hc, err := nats.Connect(natsURL, nats.Name("e2e-hostile-publisher"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.Close)

	stop := make(chan struct{})
	var load sync.WaitGroup
	for i := range 8 {
		load.Add(1)
		go func() {
			defer load.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[(i+j)%len(keys)]
				switch noID := c.batches() && (i+j)%3 != 0; {
				case (i+j)%7 == 3 && noID:
					h.submitNoID(key, "restock 5")
				case (i+j)%7 == 3:
					h.submit(key, "restock 5")
				case noID:
					h.callNoID(key, "buy 1")
				default:
					h.call(key, "buy 1")
				}
			}
		}()
	}
	stopLoad := sync.OnceValue(func() error {
		close(stop)
		return boundedWait(callTimeout+5*time.Second, "the honest load to stop", func() error { load.Wait(); return nil })
	})
	t.Cleanup(func() { _ = stopLoad() })

	bc := countBatches(t, c)
	hp := &hostilePublisher{t: t, nc: hc, ns: c.ns, rng: rng, keys: keys, nextHonest: h.next.Load, batches: c.batches()}
	began := time.Now()
	end := began.Add(runFor)
	for n := 0; n < hostileMax && time.Now().Before(end); n++ {
		hp.send(n)
		waitFor(t, time.Duration(5+rng.IntN(40))*time.Millisecond)
	}
	ended := time.Now()
	if err := stopLoad(); err != nil {
		t.Fatal(err)
	}
	t.Logf("hostile: %s", hp.summary())

	// Every honest key kept being served while the hostile messages came.
	ops := h.all()
	failed := 0
	for _, o := range ops {
		if o.Err != nil {
			if failed++; failed <= 10 {
				t.Logf("honest op of unknown outcome: %s", o)
			}
		}
	}
	for _, k := range keys {
		var ok []time.Time
		for _, o := range ops {
			if o.Key == k && o.Err == nil {
				ok = append(ok, o.Return)
			}
		}
		if gap, from := longestGap(ok, began, ended); gap > hostileStallBound {
			t.Errorf("key %s: no honest op succeeded for %s from %s into the hostile phase (bound %s)", k, gap.Round(time.Millisecond), from.Sub(began).Round(time.Millisecond), hostileStallBound)
		}
	}

	final := settle(t, c, h, keys, 60*time.Second)
	c.stopGraceful(15 * time.Second)
	runs := readTraces(t, c.traceFiles())
	rep := checkHistory(t, h.all(), runs, final, historyRules{})
	t.Logf("history: %s", rep)
	bc.check(t, runs) // the hostile batches count too: the honest ones show in the runs

	// Every stored hostile message was dead-lettered with a reason, and
	// nothing else was.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, err := keylane.DeadLetters(ctx, c.js, c.ns, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// The dead letters of one stream message: one for a one-job message
	// or a batch refused whole, one per job for a batch whose jobs are
	// dead-lettered alone (they share its sequence).
	bySeq := map[uint64][]keylane.DeadLetter{}
	for _, d := range dead {
		bySeq[d.JobSeq] = append(bySeq[d.JobSeq], d)
	}
	reasons := map[string]int{}
	for _, m := range hp.sent {
		if m.kind == "delay" {
			continue // stored again when due, at another sequence: below
		}
		for _, seq := range m.stored {
			ds := bySeq[seq]
			switch {
			case len(ds) == 0:
				t.Errorf("hostile %s (%s) stored at %d was neither refused nor dead-lettered", m.kind, m.desc, seq)
			case len(ds) < m.deadJobs:
				t.Errorf("hostile %s (%s) stored at %d: %d of its %d jobs dead-lettered, the rest neither refused nor dead-lettered", m.kind, m.desc, seq, len(ds), m.deadJobs)
			}
			for _, d := range ds {
				if d.Error == "" {
					t.Errorf("hostile %s (%s) dead-lettered at %d without a reason", m.kind, m.desc, d.Seq)
				} else {
					reasons[reasonClass(d.Error)]++
				}
			}
			delete(bySeq, seq)
		}
	}
	// A delayed job's submission is dead-lettered at its own sequence
	// when refused, or moved and stored again when due, at a sequence of
	// its own: what is left is the hostile submissions' jobs, never an
	// honest one.
	schedules := 0
	for _, m := range hp.sent {
		if m.kind == "delay" {
			schedules += len(m.stored)
		}
	}
	left := 0
	for seq, ds := range bySeq {
		for _, d := range ds {
			left++
			if strings.HasPrefix(d.JobID, h.prefix+"-") || d.JobID == "" && d.Key != "" && slices.Contains(keys, d.Key) && !strings.HasPrefix(d.Error, "malformed") {
				t.Errorf("honest job %d (ID %q, key %q) was dead-lettered: %s", seq, d.JobID, d.Key, d.Error)
			}
			if d.Error == "" {
				t.Errorf("job %d (ID %q) dead-lettered without a reason", seq, d.JobID)
			}
		}
	}
	if left > schedules {
		t.Errorf("%d dead letters are no hostile message's, and only %d hostile schedules were stored", left, schedules)
	}
	// An honest job without a caller's ID has an ID keylane drew; the
	// test named it in sale.OpHeader, which its dead letter would keep.
	for _, m := range c.deadLetters() {
		if op := m.Header.Get(sale.OpHeader); strings.HasPrefix(op, h.prefix+"-") {
			t.Errorf("honest job %s (ID %q, stored at %s) was dead-lettered: %s", op, wire.JobIDOfDead(m.Header), m.Header.Get(keylane.HeaderSeq), m.Header.Get(keylane.HeaderError))
		}
	}
	t.Logf("dead-letter reasons: %v", reasons)
}

const (
	// hostileDefault is how long the hostile publisher sends when
	// KEYLANE_HOSTILE does not say.
	hostileDefault = 15 * time.Second
	// hostileMax bounds the hostile messages of one run.
	hostileMax = 1500
	// hostileStallBound is the longest an honest key may go without an
	// honest op succeeding while hostile messages arrive. A hostile job is
	// refused or dead-lettered at once (a permanent refusal, no retries),
	// so the bound is the honest ops' own latency on a loaded machine with
	// a margin, not a retry schedule.
	hostileStallBound = 10 * time.Second
)

// hostileMsg is one message (or atomic batch) the hostile publisher sent,
// and what became of it.
type hostileMsg struct {
	kind, desc string
	refused    string   // the publish's error, if refused
	unknown    bool     // no answer: stored or not
	stored     []uint64 // the stream sequences the server stored it at
	// deadJobs is how many dead letters each stored message must have:
	// a batch's jobs dead-lettered alone each have their own; 0 or 1
	// means one.
	deadJobs int
}

// hostilePublisher crafts and sends hostile messages on its own
// connection, only to subjects a client may publish to.
type hostilePublisher struct {
	t    *testing.T
	nc   *nats.Conn
	ns   string
	rng  *rand.Rand
	keys []string
	// nextHonest is the number of the honest history's latest job ID.
	nextHonest func() int64
	sent       []*hostileMsg
	// batches: the workers read batch messages, and hostile ones are
	// among those sent.
	batches bool
	// fullBatches counts the batches of MaxBatchJobs jobs sent, which
	// cost a dead letter per job: a few make the point.
	fullBatches int
}

// clientMay reports whether the shipped accounts.conf lets a client of the
// namespace publish to subject (besides the API reads it has).
func (hp *hostilePublisher) clientMay(subject string) bool {
	parts := strings.Split(subject, ".")
	return len(parts) == 4 && parts[0] == hp.ns && (parts[1] == "jobs" || parts[1] == "delay") && parts[2] != "" && parts[3] != ""
}

// job is a well-formed job message of key, as a client would build it,
// for the crafting to spoil.
func (hp *hostilePublisher) job(key, id string, payload string) *nats.Msg {
	m := nats.NewMsg(partition.Subject(hp.ns, partition.Of(key, partitions), key))
	m.Data = []byte(payload)
	m.Header[keylane.HeaderKey] = []string{key}
	m.Header[keylane.HeaderPartitions] = []string{strconv.Itoa(partitions)}
	if id != "" {
		m.Header[keylane.HeaderJobID] = []string{id}
	}
	return m
}

// send crafts message n and publishes it.
func (hp *hostilePublisher) send(n int) {
	rng := hp.rng
	key := hp.keys[rng.IntN(len(hp.keys))]
	id := fmt.Sprintf("hostile-%d", n)
	// An honest job ID not used yet: a forgery that names it would answer
	// the honest job when it comes.
	victim := fmt.Sprintf("honest-%d", hp.nextHonest()+int64(10+rng.IntN(200)))
	// Payloads: "set 0" where the rules say the message must never run
	// (run, it would empty an honest key and the history check fails);
	// garbage where a worker may ignore the header and run the job, which
	// then fails for good and is dead-lettered anyway.
	const set0 = "set 0"
	garbage := fmt.Sprintf("hostile %d %x", n, rng.Uint64())
	kinds := 10
	if hp.batches {
		kinds = 13 // 10 to 12: hostile batch messages
	}
	switch f := rng.IntN(kinds); f {
	case 0: // a server control header on an honest key's subject
		hdr := []struct{ k, v string }{
			{"Nats-TTL", "1s"},
			{"Nats-Expected-Last-Sequence", "0"}, {"Nats-Expected-Last-Subject-Sequence", "0"},
			{"Nats-Expected-Last-Msg-Id", victim}, {"Nats-Expected-Stream", "KV_E2E-HOSTILE_RESULTS"},
			{"Nats-Schedule", "@every 1s"}, {"Nats-Scheduler", "x"}, {"Nats-Schedule-Next", "purge"},
			{"Nats-Schedule-Target", partition.Subject(hp.ns, 0, "x")}, {"Nats-Schedule-TTL", "1s"},
			{"Nats-Batch-Id", id}, {"Nats-Batch-Sequence", "1"}, {"Nats-Batch-Commit", "1"},
			{"Nats-Incr", "1"}, {"Nats-Marker-Reason", "MaxAge"}, {"Nats-Required-Api-Level", "99"},
			{"Nats-Msg-Id", victim},
			{"Nats-Rollup", "sub"}, {"Nats-Rollup", "all"},
			{"Nats-Stream-Source", hp.ns + "_DELAYS 1 x y z"},
		}[rng.IntN(20)]
		m := hp.job(key, id, garbage)
		m.Header[hdr.k] = []string{hdr.v}
		hp.publish("control", hdr.k+": "+hdr.v, m)
	case 1: // a header only workers set
		m := hp.job(key, id, garbage)
		hdr := []struct{ k, v string }{
			{keylane.HeaderRedriveOf, victim}, {keylane.HeaderReply, "elsewhere.reply"},
			{keylane.HeaderError, "forged"}, {keylane.HeaderErrorKind, "dead"},
			{keylane.HeaderFence, "999999"}, {keylane.HeaderSeq, "1"}, {keylane.HeaderWorker, "forger"},
			{keylane.HeaderAttempts, "99"}, {keylane.HeaderPayloadDropped, "5"},
			{keylane.HeaderDelayedID, victim}, {keylane.HeaderKeepOutcome, "1"}, {keylane.HeaderIdempotent, "1"},
		}[rng.IntN(12)]
		if hdr.k == keylane.HeaderDelayedID {
			// Without a Nats-Msg-Id a worker took the delayed ID as the
			// job's: a "get" run under the victim's ID, its outcome kept,
			// answered the victim's buy, which was never applied.
			delete(m.Header, keylane.HeaderJobID)
			m.Header[keylane.HeaderKeepOutcome] = []string{"1"}
			m.Data = []byte("get")
		}
		m.Header[hdr.k] = []string{hdr.v}
		hp.publish("worker-header", hdr.k+": "+hdr.v, m)
	case 2: // a job ID the results bucket cannot hold, or no ID at all
		bad := []string{id + "..1", "order 1", strings.Repeat("i", 300), id + "/x", "*", ">", id + ".", "." + id, "é" + id, id + "\x01"}[rng.IntN(10)]
		m := hp.job(key, bad, set0)
		if rng.IntN(2) == 0 {
			m.Header[keylane.HeaderKeepOutcome] = []string{"1"}
		} else {
			m.Header[keylane.HeaderIdempotent] = []string{"1"}
		}
		hp.publish("id", fmt.Sprintf("%.40q", bad), m)
	case 3: // a bad key on its own token's subject
		bad := []string{" " + key, key + " ", key + "\t", "\t" + key, "", strings.Repeat("k", 1100), key + "\xff", key + "\x00"}[rng.IntN(8)]
		m := hp.job(key, id, set0)
		m.Header[keylane.HeaderKey] = []string{bad}
		m.Subject = partition.Subject(hp.ns, partition.Of(bad, partitions), bad)
		hp.publish("key", fmt.Sprintf("%.40q", bad), m)
	case 4: // wrong partition, token or partition count
		m := hp.job(key, id, set0)
		p := partition.Of(key, partitions)
		var desc string
		switch rng.IntN(4) {
		case 0:
			desc = "wrong partition"
			m.Subject = partition.Subject(hp.ns, (p+1+rng.IntN(partitions-1))%partitions, key)
		case 1:
			desc = "wrong token"
			m.Subject = fmt.Sprintf("%s.jobs.%d.%016x", hp.ns, p, rng.Uint64())
		case 2:
			desc = "not a token"
			m.Subject = fmt.Sprintf("%s.jobs.%d.zz", hp.ns, p)
		default:
			desc = "wrong partition count"
			m.Header[keylane.HeaderPartitions] = []string{strconv.Itoa(partitions - 1)}
		}
		hp.publish("route", desc, m)
	case 5: // huge headers
		// The server takes at most 64 KiB of headers; with a payload that
		// fills max_payload too, a dead letter of it cannot keep both.
		m := hp.job(key, id, garbage)
		size := 32<<10 + rng.IntN(40<<10)
		m.Header["X-Pad"] = []string{strings.Repeat("p", size)}
		if rng.IntN(2) == 0 {
			m.Data = make([]byte, int(hp.nc.MaxPayload())-size-2048)
		}
		hp.publish("huge", fmt.Sprintf("%d bytes of header, %d of payload", size, len(m.Data)), m)
	case 6: // an atomic batch of bad jobs
		var ms []*nats.Msg
		for i := range 2 + rng.IntN(3) {
			m := hp.job(key, fmt.Sprintf("%s-b%d", id, i), set0)
			m.Header[keylane.HeaderKey] = []string{key + "\x01"} // a control character
			ms = append(ms, m)
		}
		hp.publishBatch(id, ms)
	case 7: // a delayed job's submission aimed where it should not go
		p := partition.Of(key, partitions)
		m := nats.NewMsg(partition.DelaySubject(hp.ns, p, id))
		m.Data = []byte(set0)
		m.Header[keylane.HeaderJobID] = []string{id}
		m.Header[keylane.HeaderKey] = []string{key}
		m.Header[keylane.HeaderPartitions] = []string{strconv.Itoa(partitions)}
		m.Header[keylane.HeaderRunAt] = []string{time.Now().Add(100 * time.Millisecond).UTC().Format(time.RFC3339Nano)}
		var desc string
		switch rng.IntN(6) {
		case 0:
			desc = "another partition's key"
			other := fmt.Sprintf("hostile-other-%d", rng.IntN(1000))
			for partition.Of(other, partitions) == p {
				other += "x"
			}
			m.Header[keylane.HeaderKey] = []string{other}
		case 1:
			desc = "a control character in the key"
			m.Header[keylane.HeaderKey] = []string{key + "\x7f"}
		case 2:
			desc = "another job's delay subject"
			m.Subject = partition.DelaySubject(hp.ns, p, victim)
		case 3:
			desc = "a schedule header"
			m.Header["Nats-Schedule"] = []string{"@at " + time.Now().Add(100*time.Millisecond).UTC().Format(time.RFC3339)}
			m.Header["Nats-Schedule-Target"] = []string{partition.Subject(hp.ns, p, key)}
		case 4:
			desc = "a run-at beyond the limit"
			m.Header[keylane.HeaderRunAt] = []string{time.Now().Add(keylane.MaxDelay + 24*time.Hour).UTC().Format(time.RFC3339Nano)}
		default:
			// Well formed: a client may submit a delayed job. It is moved,
			// comes due, and its handler fails for good on the garbage.
			desc = "a delayed job its handler cannot run"
			m.Data = []byte(garbage)
		}
		hp.publish("delay", desc, m)
	case 8: // what nats.go's consumer takes for a server status
		m := hp.job(key, id, "")
		status := []string{"100", "404", "408", "409"}[rng.IntN(4)]
		m.Header["Status"] = []string{status}
		m.Header["Description"] = []string{"forged"}
		hp.publish("status", "empty payload, Status "+status, m)
	case 10, 11, 12:
		hp.sendBatch(n, key, id, victim, garbage)
	default: // a well-routed job its handler cannot run
		m := hp.job(key, id, garbage)
		if rng.IntN(2) == 0 {
			m.Data = []byte{0xff, 0x00, 0xfe}
		}
		hp.publish("garbage", "unknown command", m)
	}
}

// publish sends m and records what the server said.
func (hp *hostilePublisher) publish(kind, desc string, m *nats.Msg) *hostileMsg {
	hp.t.Helper()
	if !hp.clientMay(m.Subject) {
		hp.t.Fatalf("hostile %s (%s): subject %q is not one a client may publish to", kind, desc, m.Subject)
	}
	rec := &hostileMsg{kind: kind, desc: desc}
	hp.sent = append(hp.sent, rec)
	resp, err := hp.nc.RequestMsg(m, 5*time.Second)
	hp.record(rec, resp, err, 1)
	return rec
}

// publishBatch sends ms as one JetStream atomic batch.
func (hp *hostilePublisher) publishBatch(id string, ms []*nats.Msg) {
	hp.t.Helper()
	rec := &hostileMsg{kind: "batch", desc: fmt.Sprintf("atomic batch of %d jobs with a control character in the key", len(ms))}
	hp.sent = append(hp.sent, rec)
	for i, m := range ms {
		if !hp.clientMay(m.Subject) {
			hp.t.Fatalf("hostile batch: subject %q is not one a client may publish to", m.Subject)
		}
		m.Header["Nats-Batch-Id"] = []string{id}
		m.Header["Nats-Batch-Sequence"] = []string{strconv.Itoa(i + 1)}
		if i < len(ms)-1 {
			if err := hp.nc.PublishMsg(m); err != nil {
				rec.refused = err.Error()
				return
			}
			continue
		}
		m.Header["Nats-Batch-Commit"] = []string{"1"}
		resp, err := hp.nc.RequestMsg(m, 5*time.Second)
		hp.record(rec, resp, err, len(ms))
	}
}

// record files the server's answer to a publish of n messages.
func (hp *hostilePublisher) record(rec *hostileMsg, resp *nats.Msg, err error, n int) {
	if err != nil {
		if errors.Is(err, nats.ErrTimeout) {
			rec.unknown = true
		} else {
			rec.refused = err.Error()
		}
		return
	}
	var ack struct {
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
		Count     int    `json:"count"`
		Error     *struct {
			Code        int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	switch {
	case len(resp.Data) == 0:
		rec.refused = "status " + resp.Header.Get("Status") + " " + resp.Header.Get("Description")
	case json.Unmarshal(resp.Data, &ack) != nil:
		rec.refused = "unreadable ack " + string(resp.Data)
	case ack.Error != nil:
		rec.refused = fmt.Sprintf("%d %s", ack.Error.Code, ack.Error.Description)
	case ack.Duplicate:
		rec.refused = "duplicate"
	default:
		if ack.Count > 0 {
			n = ack.Count
		}
		for s := ack.Seq - uint64(n) + 1; s <= ack.Seq; s++ {
			rec.stored = append(rec.stored, s)
		}
	}
}

// summary counts the hostile messages by kind and fate.
func (hp *hostilePublisher) summary() string {
	type count struct {
		sent, refused, stored, unknown int
		why                            []string // the first few distinct refusals
	}
	byKind := map[string]*count{}
	for _, m := range hp.sent {
		c := byKind[m.kind]
		if c == nil {
			c = &count{}
			byKind[m.kind] = c
		}
		c.sent++
		switch {
		case m.unknown:
			c.unknown++
		case m.refused != "":
			c.refused++
			if len(c.why) < 3 && !slices.Contains(c.why, m.refused) {
				c.why = append(c.why, m.refused)
			}
		default:
			c.stored++
		}
	}
	var parts []string
	for _, k := range slices.Sorted(mapKeys(byKind)) {
		c := byKind[k]
		parts = append(parts, fmt.Sprintf("%s %d (refused %d %q, stored %d, unknown %d)", k, c.sent, c.refused, c.why, c.stored, c.unknown))
	}
	return fmt.Sprintf("%d messages: %s", len(hp.sent), strings.Join(parts, "; "))
}

// reasonClass is a dead letter's reason without its details, for a count.
func reasonClass(s string) string {
	s = strings.TrimPrefix(s, "malformed: ")
	if i := strings.IndexAny(s, ":\"(0123456789"); i > 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// hostileBatchID is a batch ID (wire.ValidBatchID) made of id: its
// letters and digits, padded with Z.
func hostileBatchID(id string) string {
	var b []byte
	for i := 0; i < len(id) && len(b) < wire.BatchIDLen; i++ {
		if c := id[i]; 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			b = append(b, c)
		}
	}
	for len(b) < wire.BatchIDLen {
		b = append(b, 'Z') // not a digit: "x-1" and "x-10" stay apart
	}
	return string(b)
}

// sendBatch crafts hostile batch message n ("Batches on the wire" in
// package jetstream's doc) for key's partition and publishes it: a body
// whose framing is broken, a message whose headers or subject break a
// batch's rules (each dead-lettered whole), a batch whose every job is
// refused alone or fails for good (each dead-lettered alone), or one over
// max_payload (refused at publish). A job that must never run carries
// "set 0"; one the rules let run carries garbage its handler refuses.
func (hp *hostilePublisher) sendBatch(n int, key, id, victim, garbage string) {
	rng := hp.rng
	const set0 = "set 0"
	p := partition.Of(key, partitions)
	subject := wire.BatchSubject(hp.ns, p)
	// A batch's ID has a nuid's shape, and each of its jobs' IDs is made
	// of it and the job's index (wire.BatchedJobID), or the worker
	// refuses it: jobs that must get past those rules to reach the rule
	// they break carry such IDs.
	bid := hostileBatchID(id)
	jobID := func(i int) string { return wire.BatchedJobID(bid, i) }
	batchMsg := func(body []byte, jobs int) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = body
		m.Header["Nats-Msg-Id"] = []string{bid}
		m.Header[wire.HeaderBatch] = []string{"1"}
		m.Header[wire.HeaderBatchJobs] = []string{strconv.Itoa(jobs)}
		m.Header[keylane.HeaderPartitions] = []string{strconv.Itoa(partitions)}
		return m
	}
	encode := func(jobs []wire.BatchJob) []byte {
		body, err := wire.EncodeBatch(jobs)
		if err != nil {
			hp.t.Fatalf("hostile batch: %v", err)
		}
		return body
	}
	// jobs of honest keys of this partition that must never run.
	never := func(k int) []wire.BatchJob {
		jobs := make([]wire.BatchJob, k)
		for i := range jobs {
			jobs[i] = wire.BatchJob{Key: key, ID: jobID(i), Payload: []byte(set0)}
		}
		return jobs
	}
	// A valid batch body of 2 to 5 jobs, spoiled below.
	count := 2 + rng.IntN(4)
	body := encode(never(count))
	countAt := len("KLB") + 1 // the job count's uvarint (one byte: under 128 jobs)
	switch rng.IntN(3) {
	case 0: // broken framing: the whole message is one malformed message
		var desc string
		switch rng.IntN(7) {
		case 0:
			desc = "truncated"
			body = body[:countAt+1+rng.IntN(len(body)-countAt-1)]
		case 1:
			desc = "a length past the end"
			body = append(slices.Clone(body[:countAt+1]), 0xff, 0x7f) // a key of 16383 bytes, none there
			body = append(body, "sku"...)
		case 2:
			desc = "bytes after the last job"
			body = append(body, byte(rng.IntN(256)))
		case 3:
			desc = "wrong version byte"
			body[countAt-1] = []byte{0, 2, 0xff}[rng.IntN(3)]
		case 4:
			desc = "count over MaxBatchJobs"
			over := binary.AppendUvarint(slices.Clone(body[:countAt]), uint64(wire.MaxBatchJobs+1+rng.IntN(1<<20)))
			body = append(over, body[countAt+1:]...)
		case 5:
			desc = "count of zero"
			body = append(append(slices.Clone(body[:countAt]), 0), body[countAt+1:]...)
		default:
			desc = "no magic"
			copy(body, "XLB")
		}
		hp.publish("batch-framing", desc, batchMsg(body, count))
	case 1: // headers or subject that break a batch's rules: dead-lettered whole
		m := batchMsg(body, count)
		var desc string
		switch rng.IntN(10) {
		case 8:
			desc = "no Keylane-Batch-Jobs"
			delete(m.Header, wire.HeaderBatchJobs)
		case 9:
			desc = "a Keylane-Batch-Jobs other than the body's count"
			m.Header[wire.HeaderBatchJobs] = []string{[]string{strconv.Itoa(count - 1), strconv.Itoa(count + 1), "0", "x", strconv.Itoa(wire.MaxBatchJobs + 1)}[rng.IntN(5)]}
		case 0:
			desc = "another partition count"
			m.Header[keylane.HeaderPartitions] = []string{strconv.Itoa([]int{partitions - 1, partitions * 2, 1}[rng.IntN(3)])}
		case 1:
			desc = "another body version in Keylane-Batch"
			m.Header[wire.HeaderBatch] = []string{[]string{"2", "0", "", "11"}[rng.IntN(4)]} // (white space around "1" is trimmed on the wire: it is "1")
		case 2:
			desc = "Keylane-Key on a batch"
			m.Header[keylane.HeaderKey] = []string{key}
		case 3:
			if rng.IntN(2) == 0 {
				desc = "no batch ID"
				delete(m.Header, "Nats-Msg-Id")
			} else {
				desc = "a batch ID of a caller's shape"
				m.Header["Nats-Msg-Id"] = []string{id}
			}
		case 4:
			desc = "Keylane-Batch on a one-job message"
			m = hp.job(key, id, set0)
			m.Header[wire.HeaderBatch] = []string{"1"}
		case 5:
			desc = "a batch body on a key's subject"
			m.Subject = partition.Subject(hp.ns, p, key)
		case 6:
			desc = "a batch subject without Keylane-Batch"
			delete(m.Header, wire.HeaderBatch)
		default:
			desc = "another partition's batch subject"
			m.Subject = wire.BatchSubject(hp.ns, (p+1+rng.IntN(partitions-1))%partitions)
		}
		hp.publish("batch-header", desc, m)
	default: // every job refused alone, or failing for good: one dead letter each
		jobs := make([]wire.BatchJob, 1+rng.IntN(6))
		var descs []string
		for i := range jobs {
			j := wire.BatchJob{Key: key, ID: jobID(i), Payload: []byte(set0)}
			var desc string
			switch rng.IntN(11) {
			case 0:
				desc = "key of another partition"
				other := fmt.Sprintf("hostile-other-%d", rng.IntN(1000))
				for partition.Of(other, partitions) == p {
					other += "x"
				}
				j.Key = other
			case 1:
				desc = "control character"
				switch rng.IntN(3) {
				case 0:
					j.Key += "\x01"
				case 1:
					j.ID += "\x7f"
				default:
					j.Type = "t\x00"
				}
			case 2:
				// A job of a batch not marked as carrying its caller's ID
				// is named by its batch and index only: an honest caller's
				// ID (with the keep-outcome flag or without) is refused,
				// never run, its outcome never kept under the victim's ID,
				// whose honest job is stored and applied:
				// TestBatchJobForgingAnHonestID. Marked as its caller's
				// (the idempotent flag), a job ID is a capability since the
				// one wire path: the worker de-duplicates by it, so a
				// client that knows another's next ID can pre-empt it, as
				// a one-job message under that Nats-Msg-Id always could.
				// The defence is IDs no other client can read or guess
				// (docs/security.md), so the forger here does not know the
				// honest ones to come (this test hands it their numbers).
				desc = "an honest job's ID"
				j.ID, j.Payload = victim, []byte(garbage)
				j.KeepOutcome = rng.IntN(2) == 0
			case 10:
				desc = "another batch's job ID"
				j.ID = wire.BatchedJobID(hostileBatchID(fmt.Sprintf("%s-other", id)), i)
			case 3:
				desc = "a reply outside the inbox prefix"
				j.Reply = []string{"elsewhere.reply", hp.ns + ".jobs.0.x", "_INBOX", "_INBOX.", "_INBOX.a b"}[rng.IntN(5)]
			case 4:
				desc = "keep-outcome without a reply"
				j.KeepOutcome, j.Idempotent, j.Payload = true, rng.IntN(2) == 0, []byte(garbage)
			case 5:
				desc = "no job ID"
				j.ID = ""
			case 6:
				desc = "a reserved header"
				j.Header = map[string][]string{[]string{"Nats-Rollup", "Keylane-Key", "Status", "Nats-Msg-Id"}[rng.IntN(4)]: {"all"}}
			case 7:
				desc = "a job ID given twice"
				if i > 0 {
					j.ID = jobs[0].ID
				}
				j.Payload = []byte(garbage) // the first of them runs
			case 8:
				desc = "a job ID the results bucket cannot hold"
				j.ID = []string{id + "..1", "*", ">", id + ".", id + " x"}[rng.IntN(5)]
			default:
				desc = "a job its handler cannot run"
				j.Payload = []byte(garbage)
			}
			jobs[i] = j
			descs = append(descs, desc)
		}
		kind, desc := "batch-jobs", strings.Join(descs, ", ")
		if rng.IntN(8) == 0 {
			// Huge: past max_payload (refused at publish), or just under
			// it in a few big jobs, or MaxBatchJobs jobs with bad keys.
			kind = "batch-huge"
			switch rng.IntN(3) {
			case 0:
				desc = "a body past max_payload"
				jobs = []wire.BatchJob{{Key: key, ID: jobID(0), Payload: make([]byte, hp.nc.MaxPayload())}}
			case 1:
				desc = "4 jobs filling max_payload"
				size := int(hp.nc.MaxPayload())/4 - 1024
				jobs = nil
				for i := range 4 {
					jobs = append(jobs, wire.BatchJob{Key: key, ID: jobID(i), Payload: []byte(garbage + strings.Repeat("x", size))})
				}
			default:
				if hp.fullBatches >= 2 {
					desc = "a job its handler cannot run"
					jobs = []wire.BatchJob{{Key: key, ID: jobID(0), Payload: []byte(garbage)}}
					break
				}
				hp.fullBatches++
				desc = fmt.Sprintf("%d jobs with a control character in the key", wire.MaxBatchJobs)
				jobs = nil
				for i := range wire.MaxBatchJobs {
					jobs = append(jobs, wire.BatchJob{Key: key + "\x01", ID: jobID(i), Payload: []byte(set0)})
				}
			}
		}
		m := batchMsg(encode(jobs), len(jobs))
		var rec *hostileMsg
		if len(m.Data) > int(hp.nc.MaxPayload()) {
			rec = &hostileMsg{kind: kind, desc: desc}
			hp.sent = append(hp.sent, rec)
			if err := hp.nc.PublishMsg(m); err != nil {
				rec.refused = err.Error()
			} else {
				hp.t.Fatalf("hostile %s (%s): a publish of %d bytes past max_payload %d was not refused", kind, desc, len(m.Data), hp.nc.MaxPayload())
			}
		} else {
			rec = hp.publish(kind, desc, m)
		}
		rec.deadJobs = len(jobs)
	}
}
