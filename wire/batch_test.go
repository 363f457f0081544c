package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/keylane/keylane/partition"
)

// sampleBatch is a batch of partition 1 of 4 whose every job is valid.
func sampleBatch() []BatchJob {
	k1, k2 := keyIn(1, 4), keyIn(1, 4)+"x"
	for partition.Of(k2, 4) != 1 {
		k2 += "x"
	}
	return []BatchJob{
		{Key: k1, ID: tbID(0), Reply: "_INBOX.c.-1", KeepOutcome: true, Payload: []byte("buy 1")},
		{Key: k2, ID: tbID(1), Type: "paid", Header: map[string][]string{"X-Order": {"42", "43"}, "traceparent": {"00-aa-bb-01"}}, Payload: []byte{}},
		{Key: k1, ID: tbID(2), Header: map[string][]string{"X-Empty": {}}, Payload: bytes.Repeat([]byte{0, 0xff}, 300)},
	}
}

// testBatchID is the batch ID (Nats-Msg-Id) of the tests' batches.
const testBatchID = "T3stBatch0000000000001"

// tbID is the ID of job i of testBatchID.
func tbID(i int) string { return BatchedJobID(testBatchID, i) }

// batchHeader is a batch message's valid header of partition 1 of 4.
func batchHeader() map[string][]string {
	return map[string][]string{HeaderJobID: {testBatchID}, HeaderBatch: {"1"}, HeaderPartitions: {"4"}, "Nats-Expected-Stream": {"NS_JOBS"}}
}

// batchHeaderOf is batchHeader for a body of n jobs.
func batchHeaderOf(n int) map[string][]string {
	h := batchHeader()
	h[HeaderBatchJobs] = []string{strconv.Itoa(n)}
	return h
}

func encode(t *testing.T, jobs []BatchJob) []byte {
	t.Helper()
	b, err := EncodeBatch(jobs)
	if err != nil {
		t.Fatalf("EncodeBatch: %v", err)
	}
	return b
}

func sameJobs(a, b []BatchJob) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if !bytes.Equal(x.Payload, y.Payload) || len(x.Header) != len(y.Header) {
			return false
		}
		for k, vs := range x.Header {
			if ws, ok := y.Header[k]; !ok || len(vs) != len(ws) || len(vs) > 0 && !reflect.DeepEqual(vs, ws) {
				return false
			}
		}
		if x.Key != y.Key || x.ID != y.ID || x.Type != y.Type || x.Reply != y.Reply || x.KeepOutcome != y.KeepOutcome || x.Idempotent != y.Idempotent {
			return false
		}
	}
	return true
}

func TestBatchRoundTrip(t *testing.T) {
	jobs := sampleBatch()
	body := encode(t, jobs)
	size := len(batchMagic) + 1 + uvarintSize(len(jobs))
	for _, j := range jobs {
		size += BatchJobSize(j)
	}
	if len(body) != size {
		t.Fatalf("body of %d bytes, BatchJobSize adds up to %d", len(body), size)
	}
	got, err := DecodeBatch(body)
	if err != nil {
		t.Fatalf("DecodeBatch: %v", err)
	}
	if !sameJobs(got, jobs) {
		t.Fatalf("decoded %+v, sent %+v", got, jobs)
	}
	if again := encode(t, got); !bytes.Equal(again, body) {
		t.Fatalf("re-encoded body differs:\n%x\n%x", again, body)
	}
	// Fields are cut with no spare capacity: appending to one payload
	// leaves the next job's bytes alone.
	_ = append(got[0].Payload, 'X')
	if again := encode(t, got); !bytes.Equal(again, body) {
		t.Fatal("appending to a decoded payload changed the body")
	}
}

func TestEncodeBatchLimits(t *testing.T) {
	if _, err := EncodeBatch(nil); !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("no jobs: %v", err)
	}
	if _, err := EncodeBatch(make([]BatchJob, MaxBatchJobs+1)); !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("%d jobs: %v", MaxBatchJobs+1, err)
	}
	if _, err := EncodeBatch(make([]BatchJob, MaxBatchJobs)); err != nil {
		t.Fatalf("%d jobs: %v", MaxBatchJobs, err)
	}
	big := []BatchJob{{Payload: make([]byte, MaxBatchBytes/2)}, {Payload: make([]byte, MaxBatchBytes/2)}}
	if _, err := EncodeBatch(big); !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("over %d bytes: %v", MaxBatchBytes, err)
	}
	// A batch of one is bounded by max_payload alone: a job larger than
	// any batch of several travels so.
	one := []BatchJob{{Key: "k", ID: "a", Payload: make([]byte, MaxBatchBytes+1)}}
	body, err := EncodeBatch(one)
	if err != nil {
		t.Fatalf("one job over %d bytes: %v", MaxBatchBytes, err)
	}
	if jobs, err := DecodeBatch(body); err != nil || len(jobs) != 1 || len(jobs[0].Payload) != MaxBatchBytes+1 {
		t.Fatalf("a batch of one over %d bytes decoded as %d jobs, %v", MaxBatchBytes, len(jobs), err)
	}
}

// severalTooLarge is the body of two jobs over MaxBatchBytes, as
// EncodeBatch would never write it.
func severalTooLarge(t *testing.T) []byte {
	one := encode(t, []BatchJob{{Key: "k", ID: "a", Payload: make([]byte, MaxBatchBytes/2+1)}})
	body := append([]byte("KLB\x01\x02"), one[5:]...)
	return append(body, one[5:]...)
}

func TestDecodeBatchRefusesBrokenFraming(t *testing.T) {
	good := encode(t, []BatchJob{{Key: "k", ID: "a", Header: map[string][]string{"A": {"1"}, "B": {"2"}}, Payload: []byte("p")}})
	// Offsets in good: "KLB" 1 | count | key 1 k | id 1 a | type 0 | reply 0 |
	// flags | 2 headers | 1 A 1 1 1 | 1 B 1 1 2 | 1 p
	set := func(i int, c byte) []byte {
		b := bytes.Clone(good)
		b[i] = c
		return b
	}
	cases := map[string]struct {
		body []byte
		why  string
	}{
		"empty":              {[]byte{}, "magic"},
		"no magic":           {[]byte("KLA\x01\x01"), "magic"},
		"version 2":          {set(3, 2), "version 2"},
		"no jobs":            {[]byte("KLB\x01\x00"), "no jobs"},
		"count over limit":   {binary.AppendUvarint([]byte("KLB\x01"), MaxBatchJobs+1), "bad job count"},
		"count past the end": {set(4, 9), "job count past the end"},
		"truncated":          {good[:len(good)-1], "length of the payload"},
		"bytes after":        {append(bytes.Clone(good), 0), "bytes after the last job"},
		"long varint":        {append([]byte("KLB\x01\x81\x00"), good[5:]...), "bad job count"},
		"length past end":    {set(5, 100), "length of the key"},
		"unknown flag":       {set(11, 4), "unknown flags"},
		"headers unsorted":   {bytes.Replace(bytes.Replace(good, []byte("\x01A"), []byte("\x01C"), 1), []byte("\x01B"), []byte("\x01A"), 1), "not strictly ascending"},
		"header twice":       {bytes.Replace(good, []byte("\x01B"), []byte("\x01A"), 1), "not strictly ascending"},
		"several too large":  {severalTooLarge(t), "limit 8388608 for a batch of several"},
	}
	if _, err := DecodeBatch(good); err != nil {
		t.Fatalf("good body refused: %v", err)
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if jobs, err := DecodeBatch(c.body); !errors.Is(err, ErrBadBatch) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("DecodeBatch(%x) = %+v, %v; want ErrBadBatch, %s", c.body, jobs, err, c.why)
			}
		})
	}
}

// TestParseBatchRefusesEachBadJobAlone: each job is checked by the rule
// the one-job path uses (the same error values), a refused job keeps what
// may be trusted, and the other jobs of the batch are untouched.
func TestParseBatchRefusesEachBadJobAlone(t *testing.T) {
	jobs := sampleBatch()
	k := jobs[0].Key
	other := keyIn(2, 4)
	bad := []struct {
		job  BatchJob
		want error // errors.Is target, or nil to match text
		text string
	}{
		{BatchJob{Key: k + " ", ID: tbID(3), Reply: "_INBOX.c.-9"}, partition.ErrKeySpace, ""},
		{BatchJob{Key: other, ID: tbID(4)}, nil, "belongs to partition 2, arrived on 1"},
		{BatchJob{Key: k, ID: tbID(5), Reply: "$JS.API.STREAM.PURGE.x"}, ErrBadReply, ""},
		{BatchJob{Key: k, ID: "order..1"}, ErrBadJobID, ""},
		{BatchJob{Key: k, ID: ""}, ErrBadJobID, ""},
		{BatchJob{Key: k, ID: tbID(0)}, nil, `given twice in the batch`},
		{BatchJob{Key: k, ID: tbID(9), Type: " paid"}, ErrBadType, ""},
		{BatchJob{Key: k, ID: tbID(10), Header: map[string][]string{"Nats-Rollup": {"sub"}}}, ErrReservedHeader, ""},
		{BatchJob{Key: k, ID: tbID(11), Header: map[string][]string{"X": {"1 "}}}, ErrBadHeader, ""},
		{BatchJob{Key: k, ID: tbID(12), Header: map[string][]string{"Keylane-Redrive-Of": {"victim"}}}, ErrReservedHeader, ""},
		// A job not marked as carrying its caller's ID has its batch's and
		// index's ID: another (a caller's, another job's) would claim a
		// job without being looked up by it.
		{BatchJob{Key: k, ID: "victim-1"}, nil, `job ID "victim-1" in a batch, where job 13's ID is its batch's`},
		{BatchJob{Key: k, ID: tbID(13)}, nil, `where job 14's ID is its batch's`},
		{BatchJob{Key: k, ID: BatchedJobID("Other0Batch00000000001", 15)}, nil, "where job 15's ID is its batch's"},
		// A caller's ID is checked as any job ID.
		{BatchJob{Key: k, ID: "order..16", Idempotent: true}, ErrBadJobID, ""},
	}
	all := append([]BatchJob(nil), jobs...)
	for _, b := range bad {
		all = append(all, b.job)
	}
	entries, err := rules4.ParseBatch(BatchSubject("ns", 1), batchHeaderOf(len(all)), encode(t, all))
	if err != nil {
		t.Fatalf("ParseBatch: %v", err)
	}
	if len(entries) != len(all) {
		t.Fatalf("%d entries for %d jobs", len(entries), len(all))
	}
	for i, j := range jobs {
		e := entries[i]
		want := Job{ID: j.ID, Key: j.Key, Type: j.Type, Reply: j.Reply, KeepOutcome: j.KeepOutcome, Idempotent: j.Idempotent}
		if e.Err != nil || e.Job != want || !bytes.Equal(e.Payload, j.Payload) {
			t.Fatalf("job %d: %+v, want %+v", i, e, want)
		}
	}
	for i, b := range bad {
		e := entries[len(jobs)+i]
		switch {
		case e.Err == nil:
			t.Fatalf("bad job %+v accepted", b.job)
		case b.want != nil && !errors.Is(e.Err, b.want):
			t.Fatalf("bad job %+v: %v, want %v", b.job, e.Err, b.want)
		case b.want == nil && !strings.Contains(e.Err.Error(), b.text):
			t.Fatalf("bad job %+v: %v, want %q", b.job, e.Err, b.text)
		}
	}
	// What may be trusted of a refused job stays: the reply of a job with
	// a bad key (its caller is told), the ID of one with a bad reply.
	if e := entries[len(jobs)]; e.Job.Reply != "_INBOX.c.-9" || e.Job.ID != tbID(3) || e.Job.Key != "" {
		t.Fatalf("bad key's entry: %+v", e.Job)
	}
	if e := entries[len(jobs)+2]; e.Job.Reply != "" || e.Job.ID != tbID(5) || e.Job.Key != k {
		t.Fatalf("bad reply's entry: %+v", e.Job)
	}
	// An ID not its batch's is never trusted: a dead letter must not name
	// the job it claims.
	if e := entries[len(jobs)+10]; e.Job.ID != "" {
		t.Fatalf("a claimed ID's entry names %q", e.Job.ID)
	}
}

// TestParseBatchRefusesTheMessage: what is wrong with the message itself
// makes it one malformed message.
func TestParseBatchRefusesTheMessage(t *testing.T) {
	body := encode(t, sampleBatch())
	subj := BatchSubject("ns", 1)
	if subj != "ns.jobs.1.batch" {
		t.Fatalf("BatchSubject = %q", subj)
	}
	n := len(sampleBatch())
	with := func(name string, vs ...string) map[string][]string {
		h := batchHeaderOf(n)
		if vs == nil {
			delete(h, name)
		} else {
			h[name] = vs
		}
		return h
	}
	cases := []struct {
		name    string
		subject string
		h       map[string][]string
		body    []byte
		text    string
	}{
		{"another partition's subject", BatchSubject("ns", 2), batchHeaderOf(n), body, "not this partition's"},
		{"a key's subject", partition.Subject("ns", 1, keyIn(1, 4)), batchHeaderOf(n), body, "not this partition's"},
		{"no version", subj, with(HeaderBatch), body, "this build reads batches of version 1"},
		{"version 2", subj, with(HeaderBatch, "2"), body, "this build reads batches of version 1"},
		{"version twice", subj, with(HeaderBatch, "1", "1"), body, "given 2 times"},
		{"roll-up", subj, with("Nats-Rollup", "sub"), body, "Nats-Rollup"},
		{"schedule", subj, with("Nats-Schedule", "@at 2030-01-01T00:00:00Z"), body, "Nats-Schedule"},
		{"other N", subj, with(HeaderPartitions, "8"), body, "counts 8 partitions"},
		{"no N", subj, with(HeaderPartitions), body, "counts  partitions"},
		{"no batch ID", subj, with(HeaderJobID), body, "bad batch Nats-Msg-Id"},
		{"bad batch ID", subj, with(HeaderJobID, "a..b"), body, "bad batch Nats-Msg-Id"},
		{"a job ID for a batch ID", subj, with(HeaderJobID, "order-7"), body, "is not a batch ID"},
		{"a key header", subj, with(HeaderKey, "sku:1"), body, "carries Keylane-Key"},
		{"a delayed ID", subj, with(HeaderDelayedID, "hold.1"), body, "carries Keylane-Job-Id"},
		{"broken body", subj, batchHeaderOf(n), body[:len(body)-1], "malformed batch"},
		{"no job count", subj, with(HeaderBatchJobs), body, "Keylane-Batch-Jobs is \"\", the body holds"},
		{"another job count", subj, with(HeaderBatchJobs, strconv.Itoa(n+1)), body, "the body holds " + strconv.Itoa(n) + " jobs"},
		{"job count twice", subj, with(HeaderBatchJobs, strconv.Itoa(n), strconv.Itoa(n)), body, "given 2 times"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			es, err := rules4.ParseBatch(c.subject, c.h, c.body)
			if err == nil || !strings.Contains(err.Error(), c.text) || es != nil {
				t.Fatalf("ParseBatch = %v, %v; want a refusal with %q", es, err, c.text)
			}
		})
	}
}

// TestParseBatchOnACappedNamespace: with a key backlog cap the server
// counts a key's jobs by the key's subject, so a batch is read only as
// one job on its key's own subject; everything else is refused whole,
// naming the cap. Without a cap the rules are unchanged.
func TestParseBatchOnACappedNamespace(t *testing.T) {
	capped := rules4
	capped.MaxKeyBacklog = 3
	k, other, elsewhere := keyIn(1, 4), keyIn(1, 4)+"x", keyIn(2, 4)
	for partition.Of(other, 4) != 1 {
		other += "x"
	}
	one := encode(t, []BatchJob{{Key: k, ID: tbID(0), Reply: "_INBOX.a.-1", KeepOutcome: true}})
	two := encode(t, []BatchJob{{Key: k, ID: tbID(0)}, {Key: k, ID: tbID(1)}})
	es, err := capped.ParseBatch(partition.Subject("ns", 1, k), batchHeaderOf(1), one)
	if err != nil || len(es) != 1 || es[0].Err != nil || es[0].Job.Key != k || es[0].Job.Reply != "_INBOX.a.-1" {
		t.Fatalf("a one-job batch on its key's subject: %+v, %v; want its job", es, err)
	}
	if _, err := rules4.ParseBatch(partition.Subject("ns", 1, k), batchHeaderOf(1), one); err == nil {
		t.Fatal("without a cap, a batch on a key's subject was read")
	}
	if es, err := rules4.ParseBatch(BatchSubject("ns", 1), batchHeaderOf(2), two); err != nil || len(es) != 2 {
		t.Fatalf("without a cap, a batch of two on the batch subject: %v", err)
	}
	for _, c := range []struct {
		name, subject string
		n             int
		body          []byte
		text          string
	}{
		{"the batch subject", BatchSubject("ns", 1), 1, one, "key backlog cap of 3: a batch there carries one job"},
		{"two jobs on the key's subject", partition.Subject("ns", 1, k), 2, two, "batch of 2 jobs on a namespace with a key backlog cap"},
		{"another key's subject", partition.Subject("ns", 1, other), 1, one, "not its job's key"},
		{"another partition's key subject", partition.Subject("ns", 2, elsewhere), 1, one, "not one of this partition's key subjects"},
		{"a subject below a key's", partition.Subject("ns", 1, k) + ".x", 1, one, "not one of this partition's key subjects"},
		{"the partition's bare prefix", "ns.jobs.1.", 1, one, "not one of this partition's key subjects"},
	} {
		t.Run(c.name, func(t *testing.T) {
			es, err := capped.ParseBatch(c.subject, batchHeaderOf(c.n), c.body)
			if err == nil || !strings.Contains(err.Error(), c.text) || es != nil {
				t.Fatalf("ParseBatch = %v, %v; want a refusal with %q", es, err, c.text)
			}
		})
	}
}

func TestBatchDeadIDs(t *testing.T) {
	ids := map[string]bool{}
	for _, id := range []string{BatchDeadID(0xab, 9, 0), BatchDeadID(0xab, 9, 1), BatchDeadID(0xab, 9, 2), BatchDeadID(0xab, 10, 0), DeadID(0xab, 9)} {
		ids[id] = true
		if err := ValidateJobID(id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		// A dead letter without Keylane-Job-Id (its job's ID was refused)
		// names no job, whatever its own ID.
		if got := JobIDOfDead(map[string][]string{HeaderJobID: {id}}); got != "" {
			t.Fatalf("JobIDOfDead(%s) = %q", id, got)
		}
	}
	if len(ids) != 4 || BatchDeadID(0xab, 9, 0) != DeadID(0xab, 9) || BatchDeadID(0xab, 9, 2) != "dl-ab-9-2" {
		t.Fatalf("dead IDs %v", ids)
	}
	if got := JobIDOfDead(map[string][]string{HeaderJobID: {"dl-ab-9-x"}}); got != "dl-ab-9-x" {
		t.Fatalf("JobIDOfDead(dl-ab-9-x) = %q: not a dead letter's ID", got)
	}
}

// FuzzDecodeBatch reads fuzzed bodies: one that decodes is exactly the
// body EncodeBatch writes for what it decoded to (one body, one reading),
// and ParseBatch accepts a job only with every field within its rule and
// no ID twice.
func FuzzDecodeBatch(f *testing.F) {
	for _, jobs := range [][]BatchJob{sampleBatch(), {{Key: "k", ID: "a"}}, {{Key: keyIn(1, 4), ID: tbID(0), Header: map[string][]string{"": {""}}}}, {{Key: keyIn(1, 4), ID: tbID(0)}, {Key: keyIn(1, 4), ID: "x"}}} {
		b, err := EncodeBatch(jobs)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("KLB\x01\x01"))
	// One job of a key of partition 1, as a capped namespace reads it.
	one, err := EncodeBatch([]BatchJob{{Key: keyIn(1, 4), ID: tbID(0), Reply: "_INBOX.a.-1", KeepOutcome: true, Payload: []byte("p")}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(one)
	capped := rules4
	capped.MaxKeyBacklog = 3
	f.Fuzz(func(t *testing.T, body []byte) {
		jobs, err := DecodeBatch(body)
		// On a capped namespace a batch is read only as one job, on its
		// key's subject (and never on the batch subject).
		if len(jobs) > 0 {
			ces, cerr := capped.ParseBatch(partition.Subject("ns", 1, jobs[0].Key), batchHeaderOf(len(jobs)), body)
			if cerr == nil && len(jobs) != 1 || cerr == nil && len(ces) != 1 {
				t.Fatalf("capped: %d jobs read as %d entries, %v; want one job only", len(jobs), len(ces), cerr)
			}
			if _, berr := capped.ParseBatch(BatchSubject("ns", 1), batchHeaderOf(len(jobs)), body); berr == nil {
				t.Fatal("capped: a batch on the batch subject was read")
			}
		}
		es, perr := rules4.ParseBatch(BatchSubject("ns", 1), batchHeaderOf(len(jobs)), body)
		if err != nil {
			if !errors.Is(err, ErrBadBatch) || perr == nil {
				t.Fatalf("DecodeBatch: %v; ParseBatch: %v", err, perr)
			}
			return
		}
		again, err := EncodeBatch(jobs)
		if err != nil {
			t.Fatalf("EncodeBatch of a decoded batch: %v", err)
		}
		if !bytes.Equal(again, body) {
			t.Fatalf("decoded %x, re-encoded %x", body, again)
		}
		if perr != nil || len(es) != len(jobs) {
			t.Fatalf("ParseBatch of a decodable body: %d entries, %v", len(es), perr)
		}
		ids := map[string]bool{}
		for i, e := range es {
			if e.Err != nil {
				continue
			}
			j := e.Job
			// A generated ID is its batch's and index's, given once; a
			// caller's (marked idempotent) is any valid ID, given again
			// as it likes (the worker de-duplicates it).
			if ValidateKey(j.Key) != nil || partition.Of(j.Key, 4) != 1 || ValidateJobID(j.ID) != nil ||
				ValidateType(j.Type) != nil || j.Reply != "" && ValidateReply(j.Reply, "_INBOX.") != nil || ValidateUserHeaders(e.Header) != nil ||
				!j.Idempotent && (ids[j.ID] || j.ID != tbID(i)) {
				t.Fatalf("accepted job %d: %+v", i, e)
			}
			if !j.Idempotent {
				ids[j.ID] = true
			}
			if want := jobs[i]; j.Key != want.Key || j.ID != want.ID || !bytes.Equal(e.Payload, want.Payload) {
				t.Fatalf("job %d read as %+v, sent %+v", i, e, want)
			}
		}
	})
}

// ExampleEncodeBatch shows a batch of two jobs read back.
func ExampleEncodeBatch() {
	body, _ := EncodeBatch([]BatchJob{{Key: "sku:1", ID: "j1", Payload: []byte("1")}, {Key: "sku:2", ID: "j2", KeepOutcome: true}})
	jobs, err := DecodeBatch(body)
	fmt.Println(len(body), len(jobs), jobs[1].Key, jobs[1].KeepOutcome, err)
	// Output: 34 2 sku:2 true <nil>
}

// TestParseBatchRedriveHint: a redrive is a batch of one carrying
// Keylane-Redrive-Of; on a batch of more jobs, or naming no valid job ID,
// the hint refuses the whole message (it names one job's original).
func TestParseBatchRedriveHint(t *testing.T) {
	k := keyIn(1, 4)
	one := encode(t, []BatchJob{{Key: k, ID: "redrive-1", Idempotent: true}})
	two := encode(t, []BatchJob{{Key: k, ID: tbID(0)}, {Key: k, ID: tbID(1)}})
	with := func(n int, of ...string) map[string][]string {
		h := batchHeaderOf(n)
		h[HeaderRedriveOf] = of
		return h
	}
	if es, err := rules4.ParseBatch(BatchSubject("ns", 1), with(1, "order-7"), one); err != nil || len(es) != 1 || es[0].Err != nil {
		t.Fatalf("a redrive of one job: %+v, %v; want its job", es, err)
	}
	for _, c := range []struct {
		name string
		n    int
		h    map[string][]string
		body []byte
		text string
	}{
		{"on two jobs", 2, with(2, "order-7"), two, "on a batch of 2 jobs"},
		{"given twice", 1, with(1, "order-7", "order-8"), one, "given 2 times"},
		{"naming no job ID", 1, with(1, "a b"), one, "bad Keylane-Redrive-Of"},
		{"empty", 1, with(1, ""), one, "bad Keylane-Redrive-Of"},
	} {
		t.Run(c.name, func(t *testing.T) {
			es, err := rules4.ParseBatch(BatchSubject("ns", 1), c.h, c.body)
			if err == nil || !strings.Contains(err.Error(), c.text) || es != nil {
				t.Fatalf("ParseBatch = %v, %v; want a refusal with %q", es, err, c.text)
			}
		})
	}
}
