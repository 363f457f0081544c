package partition

import (
	"cmp"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Assign returns the owner of each of n partitions among members, given
// who holds them now: current[p] is the member holding p, or "" when p is
// free or held by someone who is not a member (current may be shorter than
// n). barred, when not nil, reports that member must not own partition p;
// a partition every member is barred from may go to any of them.
//
// It is a sticky assignment (in the spirit of Kafka's sticky assignor)
// with rendezvous hashing to break ties:
//
//   - every member may own base = n/W partitions, and n%W of them one
//     more: first those that hold more than base now, then by a hash of
//     their ID;
//   - every member keeps the partitions it holds, up to what it may own,
//     those with the highest rendezvous score of (p, member) first;
//   - every other partition (free, held by a non-member, or more than its
//     holder may own) goes, in partition order, to the member with the
//     highest rendezvous score among those with room.
//
// So every member owns floor(n/W) or ceil(n/W) partitions. Starting from
// an assignment Assign made for the same members, when one member joins
// only the partitions that move to it move, and when one leaves only its
// partitions move; Assign of its own result returns it unchanged. Only
// barred members can leave the result unbalanced: a partition no member
// with room may own goes to its holder if it may own it, or else to the
// member with the highest score that may.
//
// Assign is a pure function of its arguments (member order does not
// matter), so every worker computes the same result from the same view.
func Assign(n int, members, current []string, barred func(p int, member string) bool) []string {
	out := assignOnce(n, members, current, barred)
	if barred == nil {
		return out // one pass is a fixed point
	}
	// With bars, a pass can leave a member over its share that the next
	// pass would relieve: run it again, so that every worker's next look
	// finds nothing to move.
	for range 8 {
		next := assignOnce(n, members, out, barred)
		if slices.Equal(next, out) {
			break
		}
		out = next
	}
	return out
}

func assignOnce(n int, members, current []string, barred func(p int, member string) bool) []string {
	out := make([]string, n)
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	if len(ms) > 0 && ms[0] == "" {
		ms = ms[1:]
	}
	if len(ms) == 0 || n <= 0 {
		return out
	}
	idx := make(map[string]int, len(ms))
	for i, m := range ms {
		idx[m] = i
	}
	// open[p]: some member is not barred from p.
	open := make([]bool, n)
	for p := range open {
		open[p] = barred == nil || slices.ContainsFunc(ms, func(m string) bool { return !barred(p, m) })
	}
	may := func(p int, m string) bool { return !open[p] || barred == nil || !barred(p, m) }

	held := make([][]int, len(ms))
	for p := 0; p < n && p < len(current); p++ {
		if i, ok := idx[current[p]]; ok && may(p, current[p]) {
			held[i] = append(held[i], p)
		}
	}

	base, extra := n/len(ms), n%len(ms)
	limit := make([]int, len(ms))
	order := make([]int, len(ms))
	for i := range ms {
		limit[i], order[i] = base, i
	}
	slices.SortFunc(order, func(a, b int) int {
		if aa, bb := len(held[a]) > base, len(held[b]) > base; aa != bb {
			if aa {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(memberScore(ms[b]), memberScore(ms[a])); c != 0 {
			return c
		}
		return cmp.Compare(ms[a], ms[b])
	})
	for _, i := range order[:extra] {
		limit[i]++
	}

	load := make([]int, len(ms))
	type scored struct {
		p int
		s uint64
	}
	var keep []scored
	for i, ps := range held {
		m := ms[i]
		keep = keep[:0]
		for _, p := range ps {
			keep = append(keep, scored{p, score(p, m)})
		}
		slices.SortFunc(keep, func(a, b scored) int {
			if c := cmp.Compare(b.s, a.s); c != 0 {
				return c
			}
			return cmp.Compare(a.p, b.p)
		})
		for _, k := range keep[:min(len(keep), limit[i])] {
			out[k.p] = m
			load[i]++
		}
	}

	for p := range out {
		if out[p] != "" {
			continue
		}
		best := -1
		for i, m := range ms {
			if load[i] < limit[i] && may(p, m) && better(p, i, best, ms) {
				best = i
			}
		}
		if best < 0 {
			best = makeRoom(p, out, ms, idx, current, load, limit, may)
		}
		out[p] = ms[best]
		load[best]++
	}
	return out
}

// makeRoom picks an owner for p when every member with room is barred
// from it: a member that may own p (its holder first, then by score)
// passes one of its partitions, its lowest scored that can go, to the
// best member with room that may own that one, and takes p instead. When
// no such exchange exists, p goes to its holder if it may own it, or else
// to the best scored member that may: over its share, but owned.
func makeRoom(p int, out, ms []string, idx map[string]int, current []string, load, limit []int, may func(int, string) bool) int {
	takers := make([]int, 0, len(ms))
	for i, m := range ms {
		if may(p, m) {
			takers = append(takers, i)
		}
	}
	holder, held := idx[currentOf(current, p)]
	slices.SortFunc(takers, func(a, b int) int {
		if a == b {
			return 0
		}
		if held && (a == holder) != (b == holder) {
			if a == holder {
				return -1
			}
			return 1
		}
		if better(p, a, b, ms) {
			return -1
		}
		return 1
	})
	for _, i := range takers {
		give, to := -1, -1
		for q, m := range out {
			if m != ms[i] || q == p {
				continue
			}
			j := -1
			for k, mk := range ms {
				if k != i && load[k] < limit[k] && may(q, mk) && better(q, k, j, ms) {
					j = k
				}
			}
			if j >= 0 && (give < 0 || score(q, ms[i]) < score(give, ms[i])) {
				give, to = q, j
			}
		}
		if give >= 0 {
			out[give] = ms[to]
			load[to]++
			load[i]--
			return i
		}
	}
	return takers[0]
}

// better reports whether member i beats member best (-1 for none) for p:
// the higher rendezvous score wins, as in Owner.
func better(p, i, best int, ms []string) bool {
	if best < 0 {
		return true
	}
	s, bs := score(p, ms[i]), score(p, ms[best])
	return s > bs || (s == bs && ms[i] > ms[best])
}

func currentOf(current []string, p int) string {
	if p < len(current) {
		return current[p]
	}
	return ""
}

// memberScore orders members for the partitions that do not divide
// evenly, so that which members get one more does not follow their IDs'
// sort order.
func memberScore(m string) uint64 { return xxhash.Sum64String(m) }
