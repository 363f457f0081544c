package statestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/core"
)

// nextReference is main's next before the held log (2026-11-22): it
// copies the whole window into the next entry. The tests compare the
// incremental path with it, and the benchmark measures both.
func nextReference(s *Store, cur Entry, value []byte, fence uint64, jobs []core.Job, results [][]byte) Entry {
	last := len(jobs) - 1
	e := Entry{Value: value, Seq: jobs[last].Seq, Fence: fence, Epoch: s.epochFor(jobs[last].Partition), JobID: jobs[last].ID, Result: results[last]}
	keep := s.keep
	recent := make([]AppliedResult, 0, min(keep, len(cur.Recent)+len(jobs)))
	adopted := s.epochRelation(cur, jobs[last].Partition) == epochAdopted
	for _, r := range cur.Recent {
		if !adopted || !strings.HasPrefix(r.ID, SyntheticIDPrefix) {
			recent = append(recent, r)
		}
	}
	if cur.JobID != "" && (!adopted || !strings.HasPrefix(cur.JobID, SyntheticIDPrefix)) {
		recent = append(recent, AppliedResult{Seq: cur.Seq, ID: cur.JobID, Result: cur.Result})
	}
	for i := range last {
		recent = append(recent, AppliedResult{Seq: jobs[i].Seq, ID: jobs[i].ID, Result: results[i]})
	}
	size := 0
	from := len(recent)
	for from > 0 && len(recent)-from < keep-1 {
		r := recent[from-1]
		size += 16 + len(r.ID) + len(r.Result)
		if size > HeldBytes {
			break
		}
		from--
	}
	e.Recent = recent[from:]
	return e
}

// heldGroups makes random groups of jobs for a key: IDs sharing long, short
// or no prefixes, now and then an ID seen before or none at all, results
// repeated, differing, empty or large (to reach HeldBytes).
type heldGroups struct {
	rng *rand.Rand
	seq uint64
	n   int
}

func (g *heldGroups) next() ([]core.Job, [][]byte) {
	size := 1 + g.rng.IntN(8)
	if g.rng.IntN(4) == 0 {
		size = 1 + g.rng.IntN(300)
	}
	jobs, results := make([]core.Job, size), make([][]byte, size)
	for i := range jobs {
		g.n++
		g.seq += 1 + uint64(g.rng.IntN(3))
		var id string
		switch g.rng.IntN(20) {
		case 0:
			id = "" // a job without an ID (State.Apply's callers may send one)
		case 1:
			id = "order-" + strconv.Itoa(g.rng.IntN(g.n)) // seen before, perhaps
		case 2:
			id = strconv.Itoa(g.n) // shares little
		default:
			id = "Q2VBN8JQW3ZKTXHAJ1D4PA-" + strconv.Itoa(g.n)
		}
		var res []byte
		switch g.rng.IntN(10) {
		case 0:
			res = nil
		case 1:
			res = bytes.Repeat([]byte{'x'}, g.rng.IntN(4000))
		case 2, 3, 4:
			res = []byte("soldout 0")
		default:
			res = []byte("sold " + strconv.Itoa(g.n))
		}
		jobs[i] = core.Job{ID: id, Key: "k", Seq: g.seq, Fence: 3}
		results[i] = res
	}
	return jobs, results
}

// sameWindow says how got (the incremental path's entry) differs from want
// (the reference's): its bytes, its decoded form and its look-ups.
func sameWindow(got, want Entry, probe []string) error {
	gb, wb := encodeEntry(got), encodeState(want)
	if !bytes.Equal(gb, wb) {
		return fmt.Errorf("bytes differ: %d, want %d", len(gb), len(wb))
	}
	plain := got
	plain.view = nil
	if !reflect.DeepEqual(plain, want) {
		return fmt.Errorf("entry differs: %d held then %q, want %d then %q", len(got.Recent), got.JobID, len(want.Recent), want.JobID)
	}
	for _, id := range probe {
		gr, gok := got.Held(id)
		wr, wok := want.Held(id)
		if gok != wok || !bytes.Equal(gr, wr) {
			return fmt.Errorf("Held(%q) = %q, %v; want %q, %v", id, gr, gok, wr, wok)
		}
	}
	return nil
}

// The incremental path writes, for any sequence of groups, the entry the
// full path writes, byte for byte, and answers every look-up as a scan of
// it does; so does an entry re-read from its bytes (the cache dropped
// after a failed write), and one built from an entry whose log moved on.
// Its seed is the clock's, or HELDLOG_SEED's to repeat a failing run.
func TestHeldLogMatchesFullPath(t *testing.T) {
	seed := time.Now().UnixNano()
	if v := os.Getenv("HELDLOG_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("HELDLOG_SEED %q: %v", v, err)
		}
	}
	t.Logf("seed %d (HELDLOG_SEED=%d repeats this run)", seed, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	s := New(Config{})
	g := &heldGroups{rng: rng}
	var inc, ref Entry
	const steps = 500
	incremental, byteBound := 0, 0
	for step := range steps {
		jobs, results := g.next()
		value := []byte(strconv.Itoa(step))
		prev := inc
		if rng.IntN(50) == 0 {
			// A write built from prev that is never stored: prev's log
			// moved on, and the next write from prev must not extend it.
			s.next(prev, nil, 3, jobs[:1], results[:1])
		}
		if prev.view != nil && prev.view.log.head == prev.view && prev.JobID != "" {
			incremental++
		}
		inc = s.next(prev, value, 3, jobs, results)
		ref = nextReference(s, ref, value, 3, jobs, results)
		probe := []string{"order-" + strconv.Itoa(rng.IntN(g.n)), strconv.Itoa(rng.IntN(g.n + 1)), "absent"}
		for range 4 {
			probe = append(probe, "Q2VBN8JQW3ZKTXHAJ1D4PA-"+strconv.Itoa(rng.IntN(g.n+1)))
		}
		if len(ref.Recent) > 0 {
			probe = append(probe, ref.Recent[0].ID, ref.Recent[rng.IntN(len(ref.Recent))].ID)
		}
		if g.n > HeldJobs && len(ref.Recent)+1 < HeldJobs {
			byteBound++
		}
		if err := sameWindow(inc, ref, probe); err != nil {
			t.Fatalf("seed %d, step %d (group of %d): %v", seed, step, len(jobs), err)
		}
		if rng.IntN(40) == 0 {
			// The cache dropped: the next attempt works from the bucket's bytes.
			d, err := Decode(encodeEntry(inc))
			if err != nil {
				t.Fatalf("seed %d, step %d: %v", seed, step, err)
			}
			inc = d
			// The full path would have read the same bytes.
			if ref, err = Decode(encodeState(ref)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if incremental < steps*3/4 || byteBound == 0 {
		t.Fatalf("seed %d: %d of %d writes took the incremental path, %d windows bound by HeldBytes", seed, incremental, steps, byteBound)
	}
	t.Logf("%d of %d writes incremental, %d windows bound by HeldBytes", incremental, steps, byteBound)
}

// The comparison catches an incremental entry that lost or repeated one
// outcome: without this, TestHeldLogMatchesFullPath could pass a broken
// path.
func TestHeldLogComparisonCatchesOneOutcome(t *testing.T) {
	s := New(Config{})
	g := &heldGroups{rng: rand.New(rand.NewPCG(1, 2))}
	var inc, ref Entry
	for range 40 {
		jobs, results := g.next()
		inc = s.next(inc, nil, 3, jobs, results)
		ref = nextReference(s, ref, nil, 3, jobs, results)
	}
	if err := sameWindow(inc, ref, nil); err != nil {
		t.Fatal(err)
	}
	i := len(inc.Recent) / 2
	dropped := withHeldLog(Entry{Seq: inc.Seq, JobID: inc.JobID, Result: inc.Result, Recent: append(append([]AppliedResult(nil), inc.Recent[:i]...), inc.Recent[i+1:]...)})
	repeated := withHeldLog(Entry{Seq: inc.Seq, JobID: inc.JobID, Result: inc.Result, Recent: append(append([]AppliedResult(nil), inc.Recent[:i+1]...), inc.Recent[i:]...)})
	for name, bad := range map[string]Entry{"dropped": dropped, "repeated": repeated} {
		if err := sameWindow(bad, ref, nil); err == nil {
			t.Fatalf("an entry with one outcome %s passes the comparison", name)
		}
	}
}

// An entry re-read from the bucket (the cache dropped after a failed or
// unknown write) has no log: its first write builds one, whose index
// answers every held ID with its newest outcome and nothing else.
func TestHeldLogRebuiltAfterReread(t *testing.T) {
	s := New(Config{})
	e := saleEntry(HeldJobs, false)
	e.Recent[10].ID = e.Recent[500].ID // the same ID twice: the newest answers
	e.Recent[500].Result = []byte("newest")
	read, err := Decode(encodeState(e))
	if err != nil {
		t.Fatal(err)
	}
	next := s.next(read, []byte("v"), 7, []core.Job{{ID: "new-1", Seq: 99999}, {ID: "new-2", Seq: 100000}}, [][]byte{[]byte("a"), []byte("b")})
	if next.view == nil {
		t.Fatal("a write from a re-read entry keeps no log")
	}
	for i, r := range next.Recent {
		res, ok := next.Held(r.ID)
		want, _ := nextReference(s, read, nil, 7, []core.Job{{ID: "new-1", Seq: 99999}, {ID: "new-2", Seq: 100000}}, [][]byte{[]byte("a"), []byte("b")}).Held(r.ID)
		if !ok || !bytes.Equal(res, want) {
			t.Fatalf("held %d (%q) = %q, %v; want %q", i, r.ID, res, ok, want)
		}
	}
	if _, ok := next.Held(e.Recent[0].ID); ok {
		t.Fatalf("the outcome dropped from the window (%q) is still held", e.Recent[0].ID)
	}
	if res, ok := next.Held(e.Recent[10].ID); !ok || string(res) != "newest" {
		t.Fatalf("an ID held twice = %q, %v; want the newest outcome", res, ok)
	}
	if res, ok := next.Held("new-2"); !ok || string(res) != "b" {
		t.Fatalf("the last job = %q, %v", res, ok)
	}
	if _, ok := next.Held("never"); ok {
		t.Fatal("an ID never applied is held")
	}
}

// BenchmarkGroupCommitWindow measures what a group commit costs on a hot
// key's full window beside the reducer and the round trip: each job's
// held look-up, the next entry and its bytes. "main" is the path before
// the held log (scan, copy, full encode), "log" the incremental one.
func BenchmarkGroupCommitWindow(b *testing.B) {
	const pool = 1 << 16
	ids, results := make([]string, pool), make([][]byte, pool)
	for i := range pool {
		ids[i] = "Q2VBN8JQW3ZKTXHAJ1D4PA-" + strconv.Itoa(100000+i)
		results[i] = []byte("sold " + strconv.Itoa(i%5000))
	}
	for _, group := range []int{1, 64} {
		for _, path := range []string{"main", "log"} {
			b.Run(fmt.Sprintf("group=%d/%s", group, path), func(b *testing.B) {
				s := New(Config{})
				cur := saleEntry(HeldJobs, false)
				if path == "log" {
					cur = withHeldLog(cur)
				}
				jobs, res := make([]core.Job, group), make([][]byte, group)
				seq, n := cur.Seq, 0
				var size int
				b.ReportAllocs()
				for b.Loop() {
					for i := range jobs {
						seq++
						jobs[i], res[i] = core.Job{ID: ids[n%pool], Key: "k", Seq: seq, Fence: 7}, results[n%pool]
						n++
						if _, ok := cur.Held(jobs[i].ID); ok {
							b.Fatal("a new job is held")
						}
					}
					if path == "main" {
						cur = nextReference(s, cur, cur.Value, 7, jobs, res)
						size = len(encodeState(cur))
					} else {
						cur = s.next(cur, cur.Value, 7, jobs, res)
						size = len(encodeEntry(cur))
					}
				}
				b.ReportMetric(float64(size), "bytes/entry")
			})
		}
	}
}

// Goroutines applying to one key through one State (State is safe for
// concurrent use) race for its cached entry's log: only one extends it,
// the others copy, and every applied job is then answered with its own
// result and applied once.
func TestHeldLogSharedStateConcurrentApply(t *testing.T) {
	e := newEnv(t)
	s := New(Config{KV: e.kv})
	const writers, each = 4, 30
	var seq atomic.Uint64
	var mu sync.Mutex
	own := map[string]string{} // job ID -> its result
	jobs := map[string]uint64{}
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				for {
					sq := seq.Add(1)
					res, err := s.Apply(context.Background(), core.Job{ID: id, Key: "k", Seq: sq, Fence: 1}, add(1))
					if errors.Is(err, core.ErrGap) || errors.Is(err, ErrTooManyWriters) {
						continue // a later sequence got in first: a new one
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					own[id], jobs[id] = string(res), sq
					mu.Unlock()
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for id, res := range own {
		got, err := s.Apply(ctx(t), core.Job{ID: id, Key: "k", Seq: jobs[id], Fence: 1}, add(100))
		if err != nil || string(got) != res {
			t.Fatalf("%s again = %q, %v; want its own %q", id, got, err, res)
		}
	}
	got, err := s.Get(ctx(t), "k")
	if err != nil || string(got.Value) != strconv.Itoa(writers*each) {
		t.Fatalf("value %q, %v; want %d (every job once)", got.Value, err, writers*each)
	}
}

// BenchmarkGroupCommitWindowCold is the first group commit after a read (a
// new tenure, the cache dropped): the log path builds its log there, so it
// costs more than main's path once per read.
func BenchmarkGroupCommitWindowCold(b *testing.B) {
	read := encodeState(saleEntry(HeldJobs, false))
	jobs := []core.Job{{ID: "Q2VBN8JQW3ZKTXHAJ1D4PA-99999", Key: "k", Seq: 1 << 40, Fence: 7}}
	res := [][]byte{[]byte("sold 1")}
	for _, path := range []string{"main", "log"} {
		b.Run(path, func(b *testing.B) {
			s := New(Config{})
			b.ReportAllocs()
			for b.Loop() {
				cur, err := Decode(read)
				if err != nil {
					b.Fatal(err)
				}
				if _, ok := cur.Held(jobs[0].ID); ok {
					b.Fatal("a new job is held")
				}
				if path == "main" {
					_ = encodeState(nextReference(s, cur, cur.Value, 7, jobs, res))
				} else {
					_ = encodeEntry(s.next(cur, cur.Value, 7, jobs, res))
				}
			}
		})
	}
}

// A write that loses to another writer drops the cached entry and its log;
// the retry reads the bucket, and the log and index it builds from that
// read hold the other writer's outcomes too.
func TestHeldLogRebuiltAfterLostWrite(t *testing.T) {
	e := newEnv(t)
	mine, other := New(Config{KV: e.kv}), New(Config{KV: e.kv})
	for seq := uint64(1); seq <= 20; seq++ {
		if _, err := mine.Apply(ctx(t), core.Job{ID: "m" + strconv.FormatUint(seq, 10), Key: "k", Seq: seq, Fence: 1}, add(1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mine.Apply(ctx(t), core.Job{ID: "m1", Key: "k", Seq: 1, Fence: 1}, add(100)); err != nil {
		t.Fatal(err) // builds mine's index
	}
	if _, err := other.Apply(ctx(t), core.Job{ID: "o21", Key: "k", Seq: 21, Fence: 1}, add(1)); err != nil {
		t.Fatal(err)
	}
	// mine's cached revision is stale: its write fails, it re-reads.
	if res, err := mine.Apply(ctx(t), core.Job{ID: "m22", Key: "k", Seq: 22, Fence: 1}, add(1)); err != nil || string(res) != "now 22" {
		t.Fatalf("m22 = %q, %v; want now 22 (after o21)", res, err)
	}
	mine.mu.Lock()
	c := mine.cache[Key("k")]
	mine.mu.Unlock()
	if c.entry.view == nil {
		t.Fatal("the write after the re-read keeps no log")
	}
	for seq := uint64(1); seq <= 22; seq++ {
		id := "m" + strconv.FormatUint(seq, 10)
		if seq == 21 {
			id = "o21"
		}
		res, ok := c.entry.Held(id)
		if !ok || string(res) != "now "+strconv.FormatUint(seq, 10) {
			t.Fatalf("held %s = %q, %v; want now %d", id, res, ok, seq)
		}
	}
	if _, ok := c.entry.Held("m23"); ok {
		t.Fatal("a job never applied is held")
	}
}
