package partition

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// assignCase is one random scenario: n partitions, a member set, and who
// holds each partition now (a member, a departed worker, or nobody).
type assignCase struct {
	n       int
	members []string
	current []string
}

func randomCase(r *rand.Rand) assignCase {
	n := 1 + r.IntN(64)
	w := 1 + r.IntN(10)
	members := make([]string, w)
	for i := range members {
		members[i] = fmt.Sprintf("w%x", r.Uint32())
	}
	current := make([]string, n)
	for p := range current {
		switch k := r.IntN(4); k {
		case 0:
			current[p] = ""
		case 1:
			current[p] = "gone"
		default:
			current[p] = members[r.IntN(w)]
		}
	}
	return assignCase{n: n, members: members, current: current}
}

// seeded returns a random source whose seed the test prints, so a failure
// can be replayed.
func seeded(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed>>1))
}

func counts(out []string) map[string]int {
	c := map[string]int{}
	for _, m := range out {
		c[m]++
	}
	return c
}

func checkBalanced(t *testing.T, c assignCase, out []string) {
	t.Helper()
	lo, hi := c.n/len(c.members), (c.n+len(c.members)-1)/len(c.members)
	cnt := counts(out)
	for _, m := range c.members {
		if cnt[m] < lo || cnt[m] > hi {
			t.Fatalf("n=%d members=%v current=%v: %s owns %d, want %d..%d (result %v)", c.n, c.members, c.current, m, cnt[m], lo, hi, out)
		}
	}
	for p, m := range out {
		if !slices.Contains(c.members, m) {
			t.Fatalf("n=%d members=%v current=%v: partition %d goes to non-member %q", c.n, c.members, c.current, p, m)
		}
	}
}

func TestAssignBalancedDeterministicStable(t *testing.T) {
	r := seeded(t)
	for range 2000 {
		c := randomCase(r)
		out := Assign(c.n, c.members, c.current, nil)
		checkBalanced(t, c, out)
		shuffled := slices.Clone(c.members)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if again := Assign(c.n, shuffled, c.current, nil); !slices.Equal(again, out) {
			t.Fatalf("member order changed the result: %v then %v", out, again)
		}
		if again := Assign(c.n, c.members, out, nil); !slices.Equal(again, out) {
			t.Fatalf("not stable: Assign of %v is %v", out, again)
		}
		// A member keeps what it held, up to what it may own.
		cnt := counts(out)
		for _, m := range c.members {
			kept := 0
			for p := range out {
				if c.current[p] == m && out[p] == m {
					kept++
				}
			}
			if held := counts(c.current)[m]; kept != min(held, cnt[m]) {
				t.Fatalf("%s held %d, owns %d, kept only %d: current %v, result %v", m, held, cnt[m], kept, c.current, out)
			}
		}
	}
}

func TestAssignJoinMovesOnlyToNewMember(t *testing.T) {
	r := seeded(t)
	for range 2000 {
		c := randomCase(r)
		before := Assign(c.n, c.members, c.current, nil)
		joined := assignCase{n: c.n, members: append(slices.Clone(c.members), "new"), current: before}
		after := Assign(c.n, joined.members, before, nil)
		checkBalanced(t, joined, after)
		for p := range after {
			if after[p] != before[p] && after[p] != "new" {
				t.Fatalf("n=%d members=%v: partition %d moved from %s to %s on a join", c.n, c.members, p, before[p], after[p])
			}
		}
	}
}

func TestAssignLeaveMovesOnlyLeaversPartitions(t *testing.T) {
	r := seeded(t)
	for range 2000 {
		c := randomCase(r)
		if len(c.members) < 2 {
			continue
		}
		before := Assign(c.n, c.members, c.current, nil)
		leaver := c.members[r.IntN(len(c.members))]
		left := assignCase{n: c.n, members: slices.DeleteFunc(slices.Clone(c.members), func(m string) bool { return m == leaver }), current: before}
		after := Assign(c.n, left.members, before, nil)
		checkBalanced(t, left, after)
		for p := range after {
			if before[p] != leaver && after[p] != before[p] {
				t.Fatalf("n=%d members=%v, %s left: partition %d moved from %s to %s", c.n, c.members, leaver, p, before[p], after[p])
			}
		}
	}
}

// TestAssignBarred: a member barred from a partition neither keeps nor
// receives it, unless every member is barred from it; the result is
// stable, so a stuck mark does not make a partition bounce.
func TestAssignBarred(t *testing.T) {
	r := seeded(t)
	for range 2000 {
		c := randomCase(r)
		bar := map[[2]any]bool{}
		for range r.IntN(2 * c.n) {
			bar[[2]any{r.IntN(c.n), c.members[r.IntN(len(c.members))]}] = true
		}
		barred := func(p int, m string) bool { return bar[[2]any{p, m}] }
		out := Assign(c.n, c.members, c.current, barred)
		for p, m := range out {
			all := !slices.ContainsFunc(c.members, func(m string) bool { return !barred(p, m) })
			if barred(p, m) && !all {
				t.Fatalf("partition %d goes to %s, which is barred from it", p, m)
			}
		}
		if again := Assign(c.n, c.members, out, barred); !slices.Equal(again, out) {
			t.Fatalf("not stable with bars %v: Assign of %v is %v", bar, out, again)
		}
	}
}

func TestAssignEdges(t *testing.T) {
	if out := Assign(3, nil, nil, nil); !slices.Equal(out, []string{"", "", ""}) {
		t.Errorf("no members: %v", out)
	}
	if out := Assign(2, []string{"a", "a", ""}, nil, nil); !slices.Equal(out, []string{"a", "a"}) {
		t.Errorf("duplicate and empty members: %v", out)
	}
	// Fewer partitions than members: each member owns at most one.
	out := Assign(2, []string{"a", "b", "c"}, []string{"c", "c"}, nil)
	if cnt := counts(out); cnt["c"] != 1 || len(cnt) != 2 {
		t.Errorf("2 partitions over 3 members from c holding both: %v", out)
	}
}

// BenchmarkAssign measures one balancer's reconcile at the largest N: the
// assignment is already balanced, as it is between membership changes.
func BenchmarkAssign(b *testing.B) {
	for _, w := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("N=%d/W=%d", MaxPartitions, w), func(b *testing.B) {
			members := make([]string, w)
			for i := range members {
				members[i] = fmt.Sprintf("worker-%d", i)
			}
			current := Assign(MaxPartitions, members, nil, nil)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				Assign(MaxPartitions, members, current, nil)
			}
		})
	}
}
