package statestore

import (
	"errors"
	"strconv"
	"testing"

	"github.com/keylane/keylane/internal/core"
)

// step adds one to a key's counter, as a group reducer.
func step(_ int, cur []byte) ([]byte, []byte, error) {
	n, _ := strconv.Atoi(string(cur))
	return []byte(strconv.Itoa(n + 1)), []byte("now " + strconv.Itoa(n+1)), nil
}

// A job at or below the key's stored sequence counts as applied only if the
// entry holds that job's own outcome. Anything else is a gap (a delivery
// that never reached the worker, a restored stream) and must be an error,
// never an empty success.
func TestStateSeqBelowStoredIsNotAppliedWithoutItsOutcome(t *testing.T) {
	e := newEnv(t)
	s := New(Config{KV: e.kv})
	if _, err := s.Apply(ctx(t), core.Job{ID: "later", Key: "k", Seq: 11, Fence: 5}, add(1)); err != nil {
		t.Fatal(err)
	}
	// Seq 10 was delivered, lost on the way, and redelivered after 11 ran.
	res, err := s.Apply(ctx(t), core.Job{ID: "lost", Key: "k", Seq: 10, Fence: 5}, add(100))
	if !errors.Is(err, core.ErrGap) {
		t.Fatalf("lost job below the stored seq = %q, %v; want core.ErrGap", res, err)
	}
	// The group path says the same.
	out := make([][]byte, 1)
	n, rerr, werr := New(Config{KV: e.kv}).Group(ctx(t), []core.Job{{ID: "lost", Key: "k", Seq: 10, Fence: 5}}, out, step)
	if n != 0 || !errors.Is(rerr, core.ErrGap) || werr != nil {
		t.Fatalf("group with the lost job: n %d rerr %v werr %v; want core.ErrGap for it", n, rerr, werr)
	}
	if got, _ := s.Get(ctx(t), "k"); string(got.Value) != "1" {
		t.Fatalf("value = %q, want 1 (nothing applied)", got.Value)
	}
}

// Redeliveries of jobs applied earlier, in an earlier write, are answered
// with their own results.
func TestStateHoldsOutcomesOfEarlierWrites(t *testing.T) {
	e := newEnv(t)
	s := New(Config{KV: e.kv})
	for seq := uint64(1); seq <= 5; seq++ {
		if _, err := s.Apply(ctx(t), core.Job{ID: "j" + string(rune('0'+seq)), Key: "k", Seq: seq, Fence: 5}, add(1)); err != nil {
			t.Fatal(err)
		}
	}
	for seq := uint64(1); seq <= 5; seq++ {
		res, err := New(Config{KV: e.kv}).Apply(ctx(t), core.Job{ID: "j" + string(rune('0'+seq)), Key: "k", Seq: seq, Fence: 5}, add(100))
		if err != nil || string(res) != "now "+string(rune('0'+seq)) {
			t.Fatalf("redelivered seq %d = %q, %v; want its own result", seq, res, err)
		}
	}
}

// The same job ID submitted again after the server's duplicate window (a
// new stream sequence) takes effect once and returns the first outcome.
func TestStateSameJobIDAfterDuplicateWindowAppliesOnce(t *testing.T) {
	e := newEnv(t)
	s := New(Config{KV: e.kv})
	if _, err := s.Apply(ctx(t), core.Job{ID: "order-1", Key: "k", Seq: 3, Fence: 5}, add(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx(t), core.Job{ID: "order-2", Key: "k", Seq: 4, Fence: 5}, add(1)); err != nil {
		t.Fatal(err)
	}
	res, err := New(Config{KV: e.kv}).Apply(ctx(t), core.Job{ID: "order-1", Key: "k", Seq: 90, Fence: 5}, add(2))
	if err != nil || string(res) != "now 2" {
		t.Fatalf("retried order-1 = %q, %v; want the first outcome", res, err)
	}
	out := make([][]byte, 2)
	n, _, werr := New(Config{KV: e.kv}).Group(ctx(t), []core.Job{{ID: "order-2", Key: "k", Seq: 91, Fence: 5}, {ID: "order-3", Key: "k", Seq: 92, Fence: 5}}, out, step)
	if werr != nil || n != 2 || string(out[0]) != "now 3" {
		t.Fatalf("group with retried order-2: n %d out %q werr %v", n, out, werr)
	}
	if got, _ := s.Get(ctx(t), "k"); string(got.Value) != "4" {
		t.Fatalf("value = %q, want 4 (2+1, retries not applied, then order-3)", got.Value)
	}
}

// A full window written by group commits and read back from the bucket (a
// new owner, nothing cached) answers every held job's redelivery with its
// own result, and the first job past the window is a gap: the entry's
// encoding keeps every outcome of the window, no fewer.
func TestStateFullWindowSurvivesTheBucket(t *testing.T) {
	e := newEnv(t)
	s := New(Config{KV: e.kv})
	const total = HeldJobs + 76
	jobs := make([]core.Job, total)
	for i := range jobs {
		jobs[i] = core.Job{ID: "order-" + strconv.Itoa(100000+i), Key: "hot", Seq: uint64(10 + i), Fence: 5}
	}
	for at := 0; at < total; {
		batch := jobs[at:min(at+256, total)]
		out := make([][]byte, len(batch))
		n, rerr, werr := s.Group(ctx(t), batch, out, step)
		if werr != nil || rerr != nil || n == 0 {
			t.Fatalf("group at %d: n %d rerr %v werr %v", at, n, rerr, werr)
		}
		at += n
	}
	next := New(Config{KV: e.kv})
	for i := total - HeldJobs; i < total; i++ {
		res, err := next.Apply(ctx(t), jobs[i], add(1000))
		if want := "now " + strconv.Itoa(i+1); err != nil || string(res) != want {
			t.Fatalf("redelivered %s = %q, %v; want %q", jobs[i].ID, res, err, want)
		}
	}
	if res, err := next.Apply(ctx(t), jobs[total-HeldJobs-1], add(1000)); !errors.Is(err, core.ErrGap) {
		t.Fatalf("the job just past the window = %q, %v; want core.ErrGap", res, err)
	}
	if got, _ := next.Get(ctx(t), "hot"); string(got.Value) != strconv.Itoa(total) {
		t.Fatalf("value = %q, want %d (nothing applied twice)", got.Value, total)
	}
}
