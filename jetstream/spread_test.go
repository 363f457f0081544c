package jetstream

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keylane/keylane/partition"
)

// TestPartitionsSpreadEvenly starts W workers on 16 partitions and waits
// until each owns floor(16/W) or ceil(16/W) of them, in an assignment that
// no balancer wants to change. Plain rendezvous hashing (before the sticky
// assignment) gave three workers 5, 2 and 9 and four 3, 2, 6 and 5.
func TestPartitionsSpreadEvenly(t *testing.T) {
	const n = 16
	for _, w := range []int{3, 4} {
		t.Run(fmt.Sprintf("W=%d", w), func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: n})
			ws := make([]*Worker, w)
			ids := make([]string, w)
			for i := range ws {
				ids[i] = fmt.Sprintf("w%d", i+1)
				ws[i] = e.worker(ids[i], echo(), nil)
			}
			var counts []int
			var now map[int]string
			if !within(20*time.Second, func() bool {
				now, counts = owners(ws...), counts[:0]
				for _, x := range ws {
					counts = append(counts, len(x.Owned()))
				}
				return evenlySpread(now, n, ids)
			}) {
				t.Fatalf("partitions owned per worker %v, want each within [%d, %d]", counts, n/w, (n+w-1)/w)
			}
		})
	}
}

// evenlySpread reports whether the members own every one of n partitions,
// each member floor(n/W) or ceil(n/W) of them, so that partition.Assign
// moves none of them.
func evenlySpread(owned map[int]string, n int, members []string) bool {
	current := make([]string, n)
	for p, o := range owned {
		if p < n {
			current[p] = o
		}
	}
	w := len(members)
	for _, m := range members {
		if c := countOf(owned, m); c < n/w || c > (n+w-1)/w {
			return false
		}
	}
	return len(owned) == n && slices.Equal(partition.Assign(n, members, current, nil), current)
}
