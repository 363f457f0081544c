package e2e

import (
	"context"
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
	"github.com/keylane/keylane/partition"
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
func TestHostileWire(t *testing.T) {
	if testing.Short() {
		t.Skip("hostile wire: skipped in -short")
	}
	seed, runFor := nemesisRun(t, "hostile wire", "KEYLANE_HOSTILE", hostileDefault)
	rng := rand.New(rand.NewPCG(seed, seed^0x686f7374696c65))

	c := startCluster(t, "e2e-hostile", 2, "--delays", "--ack-wait", faultAckWait.String())
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
				if (i+j)%7 == 3 {
					h.submit(key, "restock 5")
				} else {
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

	hp := &hostilePublisher{t: t, nc: hc, ns: c.ns, rng: rng, keys: keys, nextHonest: h.next.Load}
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
	rep := checkHistory(t, h.all(), readTraces(t, c.traceFiles()), final, historyRules{})
	t.Logf("history: %s", rep)

	// Every stored hostile message was dead-lettered with a reason, and
	// nothing else was.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, err := keylane.DeadLetters(ctx, c.js, c.ns, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	bySeq := map[uint64]keylane.DeadLetter{}
	for _, d := range dead {
		bySeq[d.JobSeq] = d
	}
	reasons := map[string]int{}
	for _, m := range hp.sent {
		if m.kind == "delay" {
			continue // stored again when due, at another sequence: below
		}
		for _, seq := range m.stored {
			d, ok := bySeq[seq]
			switch {
			case !ok:
				t.Errorf("hostile %s (%s) stored at %d was neither refused nor dead-lettered", m.kind, m.desc, seq)
			case d.Error == "":
				t.Errorf("hostile %s (%s) dead-lettered at %d without a reason", m.kind, m.desc, d.Seq)
			default:
				reasons[reasonClass(d.Error)]++
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
	for seq, d := range bySeq {
		if strings.HasPrefix(d.JobID, h.prefix+"-") || d.JobID == "" && d.Key != "" && slices.Contains(keys, d.Key) && !strings.HasPrefix(d.Error, "malformed") {
			t.Errorf("honest job %d (ID %q, key %q) was dead-lettered: %s", seq, d.JobID, d.Key, d.Error)
		}
		if d.Error == "" {
			t.Errorf("job %d (ID %q) dead-lettered without a reason", seq, d.JobID)
		}
	}
	if len(bySeq) > schedules {
		t.Errorf("%d dead letters are no hostile message's, and only %d hostile schedules were stored", len(bySeq), schedules)
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
	switch f := rng.IntN(10); f {
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
	default: // a well-routed job its handler cannot run
		m := hp.job(key, id, garbage)
		if rng.IntN(2) == 0 {
			m.Data = []byte{0xff, 0x00, 0xfe}
		}
		hp.publish("garbage", "unknown command", m)
	}
}

// publish sends m and records what the server said.
func (hp *hostilePublisher) publish(kind, desc string, m *nats.Msg) {
	hp.t.Helper()
	if !hp.clientMay(m.Subject) {
		hp.t.Fatalf("hostile %s (%s): subject %q is not one a client may publish to", kind, desc, m.Subject)
	}
	rec := &hostileMsg{kind: kind, desc: desc}
	hp.sent = append(hp.sent, rec)
	resp, err := hp.nc.RequestMsg(m, 5*time.Second)
	hp.record(rec, resp, err, 1)
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
